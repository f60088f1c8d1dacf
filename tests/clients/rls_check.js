// One ShouldRateLimit call and one health Check through Node's @grpc/grpc-js.
//
// Usage: node rls_check.js TARGET DOMAIN KEY VALUE [AUTHORITY]
// TARGET is what grpc-js dials (`127.0.0.1:PORT` or `unix:/path`); AUTHORITY, when given, is
// sent as `:authority` (grpc.default_authority), as Envoy sends its cluster name. Prints one
// JSON line, {"code", "remaining", "health"}, and exits 0, or prints the gRPC error and
// exits 1. The messages are written with a few lines of protobuf encoding rather than
// generated code, so the test needs nothing but grpc-js.
'use strict';

const grpc = require('@grpc/grpc-js');

const RLS = '/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit';
const HEALTH = '/grpc.health.v1.Health/Check';

function varint(value) {
  const out = [];
  for (;;) {
    const byte = value & 0x7f;
    value = Math.floor(value / 128);
    if (value === 0) {
      out.push(byte);
      return Buffer.from(out);
    }
    out.push(byte | 0x80);
  }
}

/** A length-delimited field. */
function field(number, payload) {
  return Buffer.concat([varint((number << 3) | 2), varint(payload.length), payload]);
}

/** Field number -> value (a number for varints, a Buffer for length-delimited). */
function readFields(data) {
  const fields = new Map();
  let at = 0;
  const readVarint = () => {
    let value = 0;
    let scale = 1;
    for (;;) {
      const byte = data[at++];
      value += (byte & 0x7f) * scale;
      scale *= 128;
      if (!(byte & 0x80)) return value;
    }
  };
  while (at < data.length) {
    const key = readVarint();
    const wire = key & 7;
    let value;
    if (wire === 0) {
      value = readVarint();
    } else if (wire === 2) {
      const size = readVarint();
      value = data.subarray(at, at + size);
      at += size;
    } else if (wire === 5 || wire === 1) {
      const size = wire === 5 ? 4 : 8;
      value = data.subarray(at, at + size);
      at += size;
    } else {
      throw new Error(`wire type ${wire}`);
    }
    fields.set(key >> 3, value);
  }
  return fields;
}

function call(client, path, message) {
  const same = (buffer) => buffer;
  const deadline = new Date(Date.now() + 10000);
  return new Promise((resolve, reject) => {
    client.makeUnaryRequest(path, same, same, message, new grpc.Metadata(), { deadline },
      (error, answer) => (error ? reject(error) : resolve(answer)));
  });
}

async function main() {
  const [target, domain, key, value, authority] = process.argv.slice(2);
  const options = authority === undefined ? {} : { 'grpc.default_authority': authority };
  const client = new grpc.Client(target, grpc.credentials.createInsecure(), options);
  try {
    const entry = Buffer.concat([field(1, Buffer.from(key)), field(2, Buffer.from(value))]);
    const request = Buffer.concat([field(1, Buffer.from(domain)), field(2, field(1, entry))]);
    const answer = readFields(await call(client, RLS, request));
    const status = readFields(answer.get(2) || Buffer.alloc(0));
    const health = readFields(await call(client, HEALTH, Buffer.alloc(0)));
    console.log(JSON.stringify({
      code: answer.get(1) || 0,
      remaining: status.get(3) || 0,
      health: health.get(1) || 0,
    }));
    return 0;
  } catch (error) {
    console.log(`${error.code}: ${error.details}`);
    return 1;
  } finally {
    client.close();
  }
}

main().then((code) => process.exit(code));
