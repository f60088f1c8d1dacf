"""One RLQS stream through envoy-data-plane's generated messages and its grpclib stub.

Usage: rlqs_check.py TARGET DOMAIN
       rlqs_check.py --moved TARGET DOMAIN
       rlqs_check.py --paced TARGET DOMAIN
       rlqs_check.py --encode
TARGET is `127.0.0.1:PORT` or `unix:/path`. On one StreamRateLimitQuotas stream it sends the
two reports Envoy's rate_limit_quota filter sends: the immediate report of a new bucket
(time_elapsed 0 s), then a periodic one holding every bucket, an idle one included. It waits
up to 10 s after each for an action on every bucket just reported, half-closes, and waits for
the server to end the stream. Prints one JSON line, {"actions": [...]}, the last action seen
per bucket, and exits 0; prints the gRPC error to stderr and exits 1; exits 2 on a timeout.
`--moved` plays an Envoy whose stream broke: on one stream the immediate report of bucket
{route: moved} and two periodic ones of 4,000 allowed over 5 s; then, on a new connection,
the report Envoy's next tick sends on the stream it reopens (time_elapsed 5 s: Envoy counts
it from the bucket's last report, whatever the stream). It prints the actions of the new
stream only.
`--paced` plays an Envoy with a small share of a busy bucket: a busy Envoy reports
{route: paced} every 5 s with 10,000 denied over 5 s (twice before, and on meanwhile); then,
on a new stream, the immediate report of that bucket, after which the new stream sends
nothing and waits up to 20 s for one more action pushed without a report. It prints every
action of the new stream, in order.
`--encode` prints the periodic report's bytes in hex, for a decoder to check against.

Every byte is encoded and decoded by betterproto2 code generated from Envoy's own protos, so
the test checks the wire shape against code this project did not write. betterproto2 turns
durations into `datetime.timedelta`: nanos are seen to the microsecond only.
"""

import asyncio
import datetime
import json
import sys

from grpclib.client import Channel
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from envoy_data_plane.envoy.service.rate_limit_quota.v3 import (
    BucketId,
    RateLimitQuotaServiceAsyncStub,
    RateLimitQuotaUsageReports,
    RateLimitQuotaUsageReportsBucketQuotaUsage,
)
from envoy_data_plane.envoy.type.v3 import RateLimitStrategyBlanketRule

TIMEOUT = 10
PUSH_TIMEOUT = 20
ENCODE_DOMAIN = "clients-rlqs"


def usage(api_key, elapsed, allowed, denied, key="api_key"):
    return RateLimitQuotaUsageReportsBucketQuotaUsage(
        bucket_id=BucketId(bucket={key: api_key}),
        time_elapsed=datetime.timedelta(seconds=elapsed),
        num_requests_allowed=allowed,
        num_requests_denied=denied,
    )


def immediate_report(domain):
    return RateLimitQuotaUsageReports(
        domain=domain, bucket_quota_usages=[usage("py-1", 0, 1, 0)]
    )


def periodic_report(domain):
    return RateLimitQuotaUsageReports(
        domain=domain,
        bucket_quota_usages=[
            usage("py-1", 5, 3, 0),
            usage("py-2", 0, 1, 0),
            usage("py-3", 5, 0, 0),
        ],
    )


def key(bucket_id):
    return tuple(sorted(bucket_id.bucket.items()))


def split(delta):
    """(seconds, nanos) of a Duration, both with its sign; (0, 0) when unset."""
    if delta is None:
        return 0, 0
    micros = delta // datetime.timedelta(microseconds=1)
    seconds, rest = divmod(abs(micros), 1_000_000)
    sign = -1 if micros < 0 else 1
    return sign * seconds, sign * rest * 1000


def describe(action):
    """One action as JSON. betterproto2 leaves an unset message or oneof member None (an
    explicit ALLOW_ALL is 0, not None) and unwraps a UInt32Value to a plain int."""
    assignment = action.quota_assignment_action
    strategy = assignment.rate_limit_strategy if assignment is not None else None
    ttl = split(assignment.assignment_time_to_live if assignment is not None else None)
    out = {
        "bucket": dict(action.bucket_id.bucket),
        "kind": "none",
        "ttl_seconds": ttl[0],
        "ttl_nanos": ttl[1],
        "max_tokens": None,
        "tokens_per_fill": None,
        "fill_seconds": None,
        "fill_nanos": None,
    }
    if action.abandon_action is not None:
        out["kind"] = "abandon"
    elif strategy is None:
        pass
    elif strategy.token_bucket is not None:
        bucket = strategy.token_bucket
        out["kind"] = "token_bucket"
        out["max_tokens"] = bucket.max_tokens
        out["tokens_per_fill"] = bucket.tokens_per_fill
        if bucket.fill_interval is not None:
            out["fill_seconds"], out["fill_nanos"] = split(bucket.fill_interval)
    elif strategy.blanket_rule is not None:
        deny = strategy.blanket_rule == RateLimitStrategyBlanketRule.DENY_ALL
        out["kind"] = "deny_all" if deny else "allow_all"
    elif strategy.requests_per_time_unit is not None:
        out["kind"] = "requests_per_time_unit"
    return out


def channel_for(target):
    if target.startswith("unix:"):
        return Channel(path=target[len("unix:") :])
    host, port = target.rsplit(":", 1)
    return Channel(host=host.strip("[]"), port=int(port))


def moved_reports(domain):
    """The reports of one Envoy at 800 a second: two streams' worth, the second reopened."""
    def report(elapsed, allowed):
        return RateLimitQuotaUsageReports(
            domain=domain,
            bucket_quota_usages=[usage("moved", elapsed, allowed, 0, key="route")],
        )

    return [report(0, 1), report(5, 4000), report(5, 4000)], [report(5, 4000)]


def paced_reports(domain):
    """A busy stream's reports of {route: paced}, then a new, idle stream's first one."""
    def report(elapsed, denied):
        return RateLimitQuotaUsageReports(
            domain=domain,
            bucket_quota_usages=[usage("paced", elapsed, 0, denied, key="route")],
        )

    return report(5, 10000), report(0, 0)


async def paced(target, domain):
    """The new stream's actions, while a busy Envoy reports every 5 s as Envoy does."""
    busy, idle = paced_reports(domain)
    envoy = asyncio.create_task(converse(target, domain, [busy] * 8, every=5))
    await asyncio.sleep(5.5)
    try:
        # A stream that reports within 0.2 s of its slot is pushed its bucket at once
        # (about one in 50): a new stream has another phase.
        for _ in range(3):
            actions = await converse(target, domain, [idle], pushes=1)
            if actions[0]["kind"] == "deny_all":
                break
        return actions
    finally:
        envoy.cancel()
        await asyncio.gather(envoy, return_exceptions=True)


async def converse(target, domain, sent=None, pushes=0, every=0, in_order=False):
    """Sends `sent` (by default the immediate then the periodic report), each once the
    previous one got an action on every bucket it named and `every` seconds passed since it
    was sent, waits for `pushes` more answers,
    then half-closes. Returns the last action per bucket, or with `pushes` (or `in_order`)
    every action in order."""
    if sent is None:
        sent = [immediate_report(domain), periodic_report(domain)]
    channel = channel_for(target)
    outgoing = asyncio.Queue()

    async def reports():
        # None ends our side of the stream; the server then ends its own.
        while (report := await outgoing.get()) is not None:
            yield report

    answers = RateLimitQuotaServiceAsyncStub(channel).stream_rate_limit_quotas(reports())
    last = {}
    every_action = []

    async def until(wanted):
        """Reads answers until every id in `wanted` got an action in one of them."""
        seen = set()
        while not wanted <= seen:
            try:
                answer = await answers.__anext__()
            except StopAsyncIteration:
                raise RuntimeError("the server ended the stream before answering") from None
            for action in answer.bucket_action:
                if action.bucket_id is not None:
                    seen.add(key(action.bucket_id))
                    last[key(action.bucket_id)] = action
                    every_action.append(action)

    async def pushed():
        answer = await answers.__anext__()
        every_action.extend(answer.bucket_action)

    async def drain():
        async for answer in answers:
            for action in answer.bucket_action:
                if action.bucket_id is not None:
                    last[key(action.bucket_id)] = action

    try:
        for report in sent:
            outgoing.put_nowait(report)
            wanted = {key(item.bucket_id) for item in report.bucket_quota_usages}
            sent_at = asyncio.get_running_loop().time()
            await asyncio.wait_for(until(wanted), TIMEOUT)
            await asyncio.sleep(max(0, sent_at + every - asyncio.get_running_loop().time()))
        for _ in range(pushes):
            # Only a blanket rule (the denial until the slot) waits for a push.
            denial = every_action[-1].quota_assignment_action
            if denial is None or denial.rate_limit_strategy.blanket_rule is None:
                break
            await asyncio.wait_for(pushed(), PUSH_TIMEOUT)
        outgoing.put_nowait(None)
        await asyncio.wait_for(drain(), TIMEOUT)
    finally:
        channel.close()
    ordered = pushes or in_order
    return [describe(action) for action in (every_action if ordered else last.values())]


def main():
    if sys.argv[1:] == ["--encode"]:
        print(bytes(periodic_report(ENCODE_DOMAIN)).hex())
        return 0
    mode = sys.argv[1] if sys.argv[1] in ("--moved", "--paced") else None
    target, domain = sys.argv[1 + bool(mode) : 3 + bool(mode)]

    async def run():
        if mode is None:
            return await converse(target, domain)
        if mode == "--moved":
            before, after = moved_reports(domain)
            await converse(target, domain, before)
            # Every action in order: the blanket rule that comes first, then the bucket.
            return await converse(target, domain, after, in_order=True)
        return await paced(target, domain)

    try:
        actions = asyncio.run(run())
    except GRPCError as error:
        print(f"{error.status.name}: {error.message}", file=sys.stderr)
        return 1
    except asyncio.TimeoutError:
        print(f"no complete answer within {TIMEOUT} s", file=sys.stderr)
        return 2
    except (OSError, RuntimeError, ProtocolError, StreamTerminatedError) as error:
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(json.dumps({"actions": actions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
