{{/* Names and labels shared by every template. */}}
{{- define "kvgate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvgate.labels" -}}
app.kubernetes.io/part-of: kvgate
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvgate.selector" -}}
app.kubernetes.io/name: kvgate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvgate.vllmSelector" -}}
app.kubernetes.io/name: vllm
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvgate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "kvgate.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{ .Values.serviceAccount.name | default (include "kvgate.fullname" .) }}
{{- else -}}
{{ .Values.serviceAccount.name | default "default" }}
{{- end -}}
{{- end -}}

{{/* How the pool finds its replicas: the chart's vLLM Service unless told otherwise. */}}
{{- define "kvgate.discovery" -}}
{{- if eq .Values.pool.discovery "auto" -}}
{{- if .Values.vllm.enabled }}kubernetes{{ else }}{{ fail "pool.discovery: with vllm.enabled false, say where the fleet is: kubernetes, dns or static" }}{{ end -}}
{{- else -}}
{{ .Values.pool.discovery }}
{{- end -}}
{{- end -}}

{{- define "kvgate.vllmDeployment" -}}
{{- if .Values.autoscaler.deployment -}}
{{ .Values.autoscaler.deployment }}
{{- else if .Values.vllm.enabled -}}
{{ include "kvgate.fullname" . }}-vllm
{{- end -}}
{{- end -}}

{{/* The gateway's kvgate.yaml: the user's config with what the chart owns set over it. */}}
{{- define "kvgate.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- $server := merge (dict "host" "0.0.0.0" "port" 8080) (get $config "server" | default dict) -}}
{{- $_ := set $server "host" "0.0.0.0" -}}
{{- $_ := set $server "port" 8080 -}}
{{- $_ := set $config "server" $server -}}
{{- $pool := dict "name" .Values.pool.name "role" .Values.pool.role "max_sequences" (int .Values.pool.maxSequences) -}}
{{- $discovery := include "kvgate.discovery" . -}}
{{- if eq $discovery "kubernetes" -}}
{{- $k := dict "port" (toString .Values.pool.kubernetes.port) "refresh_s" 5 -}}
{{- if .Values.vllm.enabled -}}
{{- $_ := set $k "service" (printf "%s-vllm" (include "kvgate.fullname" .)) -}}
{{- $_ := set $k "port" "http" -}}
{{- else if .Values.pool.kubernetes.selector -}}
{{- $_ := set $k "selector" .Values.pool.kubernetes.selector -}}
{{- else if .Values.pool.kubernetes.service -}}
{{- $_ := set $k "service" .Values.pool.kubernetes.service -}}
{{- else -}}
{{- fail "pool.kubernetes: give selector or service" -}}
{{- end -}}
{{- $_ := set $k "namespace" (.Values.pool.kubernetes.namespace | default .Release.Namespace) -}}
{{- $_ := set $pool "kubernetes" $k -}}
{{- else if eq $discovery "dns" -}}
{{- if not .Values.pool.dns.name }}{{ fail "pool.dns.name: the headless Service's DNS name" }}{{ end -}}
{{- $_ := set $pool "dns" (dict "name" .Values.pool.dns.name "port" (int .Values.pool.dns.port)) -}}
{{- else -}}
{{- if not .Values.pool.static }}{{ fail "pool.static: at least one replica URL" }}{{ end -}}
{{- $_ := set $pool "replicas" .Values.pool.static -}}
{{- end -}}
{{- if .Values.vllmApiKey.existingSecret -}}
{{- $_ := set $pool "api_key_file" (printf "/etc/kvgate/vllm/%s" .Values.vllmApiKey.key) -}}
{{- end -}}
{{- $_ := set $config "pools" (list $pool) -}}
{{- $auth := get $config "auth" | default dict -}}
{{- $_ := set $auth "enabled" .Values.auth.enabled -}}
{{- if and .Values.auth.existingSecret .Values.auth.adminTokenKey -}}
{{- $_ := set $auth "admin_token_file" (printf "/etc/kvgate/secrets/%s" .Values.auth.adminTokenKey) -}}
{{- else -}}
{{- $_ := set $auth "admin_token_file" "/etc/kvgate/admin/admin-token" -}}
{{- end -}}
{{- if .Values.auth.existingSecret -}}
{{- if .Values.auth.observabilityTokenKey -}}
{{- $_ := set $auth "observability_token_file" (printf "/etc/kvgate/secrets/%s" .Values.auth.observabilityTokenKey) -}}
{{- end -}}
{{- $tenants := list -}}
{{- range .Values.auth.tenants -}}
{{- $tenants = append $tenants (dict "name" .name "api_keys_file" (printf "/etc/kvgate/secrets/%s" .keysKey)) -}}
{{- end -}}
{{- $_ := set $auth "tenants" $tenants -}}
{{- end -}}
{{- $_ := set $config "auth" $auth -}}
{{- if .Values.coordination.enabled -}}
{{- $coordination := get $config "coordination" | default dict -}}
{{- if .Values.coordination.redis.deploy -}}
{{- $_ := set $coordination "redis_url" (printf "redis://%s-redis:6379/0" (include "kvgate.fullname" .)) -}}
{{- else -}}
{{- $_ := set $coordination "redis_url_file" (printf "/etc/kvgate/redis/%s" .Values.coordination.urlKey) -}}
{{- end -}}
{{- $_ := set $config "coordination" $coordination -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The chart's own admin token (no existing Secret names one): /admin/* is the autoscaler's way to
each gateway's replicas, and without a token it answers loopback clients only. */}}
{{- define "kvgate.ownAdminToken" -}}
{{- not (and .Values.auth.existingSecret .Values.auth.adminTokenKey) -}}
{{- end -}}
