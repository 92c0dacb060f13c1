// A ddmq-proxy consumer in Node.js over Thrift: the service code is generated from the proxy's IDL
// (`npm run generate`, Apache Thrift's compiler), the transport is the official `thrift` library.
//
// The proxy speaks framed transport + compact protocol, so both are set here: a call on the binary
// protocol or without framing gets a PROTOCOL_ERROR saying so, and its connection is closed.
//
//   node consumer.js --port 9713 --group cg_rides --topic rides --count 100 [--fail-first]
//
// Each message is printed as one JSON line ({"event": "delivered", qid, offset, key, value}); the
// acks of a batch ride on the next pull (`result`, one ConsumeResult per (topic, qid), linked
// through `nextResult`). --fail-first fails the first message it is handed once: the proxy hands it
// out again after the group's retry interval, before any later message of its key.
"use strict";

const thrift = require("thrift");
const ConsumerService = require("./gen/ConsumerService");
const types = require("./gen/consumerProxy_types");

function options(argv) {
  const out = { host: "127.0.0.1", port: 9713, group: "", topic: "", count: 0, failFirst: false, lingerMs: 1000 };
  for (let i = 0; i < argv.length; i++) {
    const name = argv[i];
    if (name === "--fail-first") out.failFirst = true;
    else if (name === "--host") out.host = argv[++i];
    else if (name === "--port") out.port = Number(argv[++i]);
    else if (name === "--group") out.group = argv[++i];
    else if (name === "--topic") out.topic = argv[++i];
    else if (name === "--count") out.count = Number(argv[++i]);
    else if (name === "--linger-ms") out.lingerMs = Number(argv[++i]);
    else throw new Error(`unknown option ${name}`);
  }
  if (!out.group || !out.topic || !(out.count > 0)) throw new Error("--group, --topic and --count are required");
  return out;
}

// The acks and fails of one reply as the ConsumeResult of its (topic, qid). A consumer that pulled
// several queues before acking links one ConsumeResult per queue through nextResult.
function resultOf(context, success, fail) {
  return new types.ConsumeResult({ context, successOffsets: success, failOffsets: fail });
}

function chain(results) {
  for (let i = 0; i + 1 < results.length; i++) results[i].nextResult = results[i + 1];
  return results.length ? results[0] : null;
}

async function main() {
  const opts = options(process.argv.slice(2));
  const connection = thrift.createConnection(opts.host, opts.port, {
    transport: thrift.TFramedTransport,
    protocol: thrift.TCompactProtocol,
    connect_timeout: 5000,
  });
  connection.on("error", (err) => {
    console.error(`connection error: ${err.message}`);
    process.exit(2);
  });
  const client = thrift.createClient(ConsumerService, connection);
  let acked = 0;
  let failedOnce = !opts.failFirst;
  let pending = [];
  while (acked < opts.count) {
    const request = new types.PullRequest({
      groupId: opts.group,
      topic: opts.topic,
      maxBatchSize: 32,
      maxLingerTime: opts.lingerMs,
      result: chain(pending),
    });
    let reply;
    try {
      reply = await client.pull(request);
    } catch (err) {
      // PullException: code 1001 unknown group, 1002 unknown topic, 1003 bad request, ...
      console.error(`pull refused: ${err.code} ${err.message}`);
      process.exit(3);
    }
    pending = [];
    if (!reply.messages.length) continue; // none within maxLingerTime: context.qid is "" then
    const success = [];
    const fail = [];
    for (const message of reply.messages) {
      const offset = Number(message.offset); // an i64: node-int64, exact below 2^53
      const line = { event: "delivered", qid: reply.context.qid, offset, key: message.key,
                     value: message.value.toString("utf8") };
      console.log(JSON.stringify(line));
      if (!failedOnce) {
        failedOnce = true;
        fail.push(offset);
        console.log(JSON.stringify({ ...line, event: "failed" }));
      } else {
        success.push(offset);
        acked++;
      }
    }
    pending.push(resultOf(reply.context, success, fail));
  }
  // The last acks ride on no pull: submit sends them alone.
  await client.submit(chain(pending));
  connection.end();
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});
