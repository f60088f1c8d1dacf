"""One ShouldRateLimit call and one health Check through Python grpcio (gRPC C-core).

Usage: rls_check.py TARGET DOMAIN KEY VALUE [AUTHORITY]
TARGET is what grpcio dials (`127.0.0.1:PORT` or `unix:/path`); AUTHORITY, when given, is
sent as `:authority` (grpc.default_authority), as Envoy sends its cluster name. Prints one
JSON line, {"code": <overall_code>, "remaining": <first status' limit_remaining>,
"health": <serving status>}, and exits 0, or prints the gRPC error and exits 1.
The messages are written with a few lines of protobuf encoding rather than generated code,
so the test needs nothing but grpcio.
"""

import json
import sys

import grpc

RLS = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
HEALTH = "/grpc.health.v1.Health/Check"


def varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, payload):
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def read_fields(data):
    """(number, value) of each field: an int for varints, bytes for length-delimited."""
    at = 0
    while at < len(data):
        key, at = read_varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = read_varint(data, at)
        elif wire == 2:
            size, at = read_varint(data, at)
            value, at = data[at : at + size], at + size
        elif wire == 5:
            value, at = data[at : at + 4], at + 4
        elif wire == 1:
            value, at = data[at : at + 8], at + 8
        else:
            raise ValueError(f"wire type {wire}")
        yield number, value


def read_varint(data, at):
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def rls_request(domain, key, value):
    entry = field(1, key.encode()) + field(2, value.encode())
    return field(1, domain.encode()) + field(2, field(1, entry))


def main():
    target, domain, key, value = sys.argv[1:5]
    options = []
    if len(sys.argv) > 5:
        options.append(("grpc.default_authority", sys.argv[5]))
    with grpc.insecure_channel(target, options=options) as channel:
        try:
            raw = channel.unary_unary(RLS)(rls_request(domain, key, value), timeout=10)
            health = channel.unary_unary(HEALTH)(b"", timeout=10)
        except grpc.RpcError as error:
            print(f"{error.code()}: {error.details()}")
            return 1
    answer = dict(read_fields(raw))
    status = dict(read_fields(answer.get(2, b"")))
    print(
        json.dumps(
            {
                "code": answer.get(1, 0),
                "remaining": status.get(3, 0),
                "health": dict(read_fields(health)).get(1, 0),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
