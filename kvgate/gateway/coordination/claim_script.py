"""The one Redis script the claims ride on, and its wire format both ways.

``CLAIM`` renews this gateway's claim on each replica, grants what it asks for as far as the other
live claims leave room, drops claims whose lease ran out and fields that are not claims, and answers
what the others hold and want. It runs atomically, so the claims on a replica never sum to more than
its capacity, whichever gateways race. A sync reads a bounded amount whatever is stored: at most
``MAX_GATEWAYS`` fields per replica (a bigger hash, or a key of the wrong type, leaves the replica
unclaimed and is counted as a bad value).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate.admission.claims import Grant, ReplicaDemand, Share

MAX_GATEWAYS = 256
"""Fields of one replica's claims hash a sync reads; a bigger hash is broken or hostile."""
MAX_VALUE = 1 << 40
"""Above this (about 10^12 tokens) a stored number is not part of a claim."""
CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, lease, most, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
for i = 1, #KEYS do
  local a = 4 + (i - 1) * 8
  local key = KEYS[i]
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'hash' and kind ~= 'none' then
    out[i] = {-1}
  elseif redis.call('HLEN', key) > most then
    out[i] = {-2}
  else
    local cap_kv, cap_seq = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
    local o_kv, o_seq, o_used, bad, wants = 0, 0, 0, 0, {}
    local fields = redis.call('HGETALL', key)
    for j = 1, #fields, 2 do
      if fields[j] ~= me then
        local v = {}
        for word in string.gmatch(fields[j + 1], '[^ ]+') do v[#v + 1] = tonumber(word) end
        local ok = #v == 9
        for k = 1, #v do
          if v[k] < 0 or (k < 9 and v[k] > limit) or v[k] ~= math.floor(v[k]) then ok = false end
        end
        if not ok then
          bad = bad + 1
          redis.call('HDEL', key, fields[j])
        elseif v[9] <= now then
          redis.call('HDEL', key, fields[j])
        else
          o_kv, o_seq, o_used = o_kv + v[1], o_seq + v[2], o_used + v[5]
          cap_kv, cap_seq = math.min(cap_kv, v[7]), math.min(cap_seq, v[8])
          wants[#wants + 1] = v[3]
          wants[#wants + 1] = v[4]
        end
      end
    end
    local g_kv = math.max(0, math.min(tonumber(ARGV[a + 1]), cap_kv - o_kv))
    local g_seq = math.max(0, math.min(tonumber(ARGV[a + 2]), cap_seq - o_seq))
    local value = string.format('%d %d %s %s %s %s %s %s %d', g_kv, g_seq, ARGV[a + 5], ARGV[a + 6],
      ARGV[a + 7], ARGV[a + 8], ARGV[a + 3], ARGV[a + 4], now + lease)
    redis.call('HSET', key, me, value)
    redis.call('PEXPIRE', key, lease)
    out[i] = {g_kv, g_seq, o_kv, o_seq, bad, wants, o_used}
  end
end
return out
"""
"""Claim per replica, atomically: drop the other fields that are not claims or whose lease ran out,
grant what this gateway asks for up to what the other claims leave of the smallest capacity any live
gateway sees, store it with its expiry, and answer the grant, the others' claims and wants, and the
KV tokens the others' reservations use."""


def claims_key(namespace: str, replica_id: str) -> str:
    """The hash of every gateway's claim on ``replica_id``."""
    return f"{{{namespace}}}:claims:{replica_id}"


def claim_args(
    gateway_id: str,
    lease_s: float,
    replicas: Sequence[str],
    demands: Mapping[str, ReplicaDemand],
    asked: Mapping[str, Share],
) -> list[Any]:
    """``CLAIM``'s ARGV: who asks and for how long, then eight numbers per replica in ``replicas``."""
    args: list[Any] = [gateway_id, int(lease_s * 1000), MAX_GATEWAYS, MAX_VALUE]
    for replica_id in replicas:
        demand = demands[replica_id]
        ask, capacity, want, used = asked[replica_id], demand.capacity, demand.want, demand.used
        args += [ask.kv_tokens, ask.sequences, capacity.kv_tokens, capacity.sequences]
        args += [want.kv_tokens, want.sequences, used.kv_tokens, used.sequences]
    return args


@dataclass
class ClaimAnswer:
    """``CLAIM``'s answer for every replica asked."""

    grants: dict[str, Grant | None] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)
    """What was skipped, one line per replica."""
    bad_values: int = 0
    """Values skipped: each field that was not a claim, each key that is not a claims hash."""


def read_answer(replicas: Sequence[str], results: Sequence[Any]) -> ClaimAnswer:
    """``CLAIM``'s reply, one entry per replica of ``replicas`` in order."""
    answer = ClaimAnswer()
    for replica_id, result in zip(replicas, results, strict=True):
        grant = _grant(result)
        if isinstance(grant, str):
            answer.bad.append(f"replica {replica_id!r}: {grant}")
            answer.bad_values += 1
            answer.grants[replica_id] = None
            continue
        answer.grants[replica_id] = grant
        dropped = int(result[4])
        if dropped:
            answer.bad_values += dropped
            answer.bad.append(f"replica {replica_id!r}: dropped {dropped} field(s) that are not claims")
    return answer


def _grant(answer: Any) -> Grant | str:
    """One replica's answer from ``CLAIM``, or why it claims nothing."""
    if answer[0] == -1:
        return "the key is not a hash"
    if answer[0] == -2:
        return f"over {MAX_GATEWAYS} gateways claim the replica"
    g_kv, g_seq, o_kv, o_seq, _, wants, o_used = answer
    others_want = tuple(Share(int(wants[i]), int(wants[i + 1])) for i in range(0, len(wants) - 1, 2))
    return Grant(Share(int(g_kv), int(g_seq)), Share(int(o_kv), int(o_seq)), others_want, int(o_used))


@dataclass
class _Answer:
    grants: dict[str, Grant | None] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)
    """What was skipped, one line per replica."""
    bad_values: int = 0
    """Values skipped: each field that was not a claim, each key that is not a claims hash."""
