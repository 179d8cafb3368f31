"""``KubernetesActuator``: the scale patch it sends, read off the official client's own request
building (``AppsV1Api`` over a recording urllib3 pool, no cluster, no socket), and that an
unchanged size sends nothing."""

from __future__ import annotations

import io
from typing import Any

import orjson
import urllib3
from kubernetes import client

from kvgate.autoscaler.actuators import KubernetesActuator
from kvgate.autoscaler.recommendation import Recommendation

NAMESPACE = "inference"
DEPLOYMENT = "vllm-decode"
SCALE_PATH = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}/scale"


class RecordingPool:
    """Stands in for urllib3's pool manager under the Kubernetes client: answers a Scale of
    ``replicas`` to every call and keeps what was sent."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.sent: list[tuple[str, str, dict[str, str], Any]] = []

    def request(self, method: str, url: str, **kwargs: Any) -> urllib3.HTTPResponse:
        body = kwargs.get("body")
        self.sent.append((method, url, dict(kwargs.get("headers") or {}), body))
        if method == "PATCH":
            assert isinstance(body, str | bytes)
            self.replicas = orjson.loads(body)["spec"]["replicas"]
        scale = {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE},
            "spec": {"replicas": self.replicas},
            "status": {"replicas": self.replicas},
        }
        return urllib3.HTTPResponse(
            body=io.BytesIO(orjson.dumps(scale)),
            status=200,
            headers={"content-type": "application/json"},
            preload_content=False,
        )


def apps_api(pool: RecordingPool) -> client.AppsV1Api:
    api_client = client.ApiClient(client.Configuration(host="https://kubernetes.invalid"))
    api_client.rest_client.pool_manager = pool  # type: ignore[assignment]
    return client.AppsV1Api(api_client)


def actuator(pool: RecordingPool) -> KubernetesActuator:
    return KubernetesActuator(apps_api(pool), NAMESPACE, {"decode": DEPLOYMENT})


async def test_scale_out_patches_the_scale_subresource_with_a_merge_patch_of_spec_replicas() -> None:
    pool = RecordingPool(replicas=2)
    await actuator(pool).apply(Recommendation("decode", 5, "scale_out_sequences"))
    (read, patch) = pool.sent
    assert read[0] == "GET" and read[1].endswith(SCALE_PATH)
    method, url, headers, body = patch
    assert method == "PATCH" and url == f"https://kubernetes.invalid{SCALE_PATH}"
    assert headers["Content-Type"] == "application/strategic-merge-patch+json"
    assert orjson.loads(body) == {"spec": {"replicas": 5}}
    assert pool.replicas == 5


async def test_same_size_reads_and_sends_no_patch_and_other_pools_are_left_alone() -> None:
    pool = RecordingPool(replicas=3)
    scaler = actuator(pool)
    await scaler.apply(Recommendation("decode", 3, "hold"))
    assert [method for method, *_ in pool.sent] == ["GET"]
    await scaler.apply(Recommendation("prefill", 9, "scale_out_token_rate"))
    assert [method for method, *_ in pool.sent] == ["GET"]
    await scaler.apply(Recommendation("decode", 2, "scale_in_idle"))
    assert [method for method, *_ in pool.sent] == ["GET", "GET", "PATCH"]
    assert pool.replicas == 2


def test_the_pods_a_scale_in_removes_are_those_with_least_work_then_unrouted_then_newest() -> None:
    from kvgate.autoscaler.actuators import PodReplica, choose_victims

    pods = [
        PodReplica("old-busy", "10.0.0.1:8000", "2026-01-01T00:00:01Z", True),
        PodReplica("old-idle", "10.0.0.2:8000", "2026-01-01T00:00:02Z", True),
        PodReplica("new-idle", "10.0.0.3:8000", "2026-01-01T00:00:03Z", True),
        PodReplica("not-ready", "10.0.0.4:8000", "2026-01-01T00:00:00Z", True),
    ]
    in_flight = {"10.0.0.1:8000": 5, "10.0.0.2:8000": 0, "10.0.0.3:8000": 0}
    assert [p.name for p in choose_victims(pods, in_flight, 3)] == ["not-ready", "new-idle", "old-idle"]
    assert choose_victims(pods, in_flight, 0) == []
