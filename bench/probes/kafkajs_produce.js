// A probe, not a scenario: how fast kafkajs produces to a running broker at a given partition
// count. kafkajs, unlike librdkafka, puts every partition's batch for one broker into one
// ProduceRequest, so it tells whether the one-partition-per-request client is what limits the
// 10,000-partition step of `python -m bench partitions`.
//
//   neve dev &                                           # or any broker on the address below
//   node bench/probes/kafkajs_produce.js 127.0.0.1:9092 TOPIC PARTITIONS [SECONDS] [RECORDS_PER_SEND] [SENDS_IN_FLIGHT]
//
// Creates TOPIC with PARTITIONS partitions, then for SECONDS (default 15) keeps SENDS_IN_FLIGHT
// (default 4) producer.send calls going, each of RECORDS_PER_SEND (default 1000) 1 KiB records,
// record i to partition i % PARTITIONS (acks=all). Prints one JSON line: MB/s of acknowledged
// record values, sends, and this process's CPU seconds (to see whether the client is the limit).
// kafkajs comes from tests/clients/kafkajs (installed by `make test` or `make dev`).

'use strict'

const path = require('path')
const { Kafka, logLevel } = require(path.join(__dirname, '..', '..', 'tests', 'clients', 'kafkajs', 'node_modules', 'kafkajs'))

const [bootstrap, topic, partitionsArg, secondsArg = '15', perSendArg = '1000', inflightArg = '4'] = process.argv.slice(2)
if (!bootstrap || !topic || !partitionsArg) {
  process.stderr.write('usage: kafkajs_produce.js BOOTSTRAP TOPIC PARTITIONS [SECONDS] [RECORDS_PER_SEND] [SENDS_IN_FLIGHT]\n')
  process.exit(2)
}
const partitions = Number(partitionsArg)
const seconds = Number(secondsArg)
const perSend = Number(perSendArg)
const inflight = Number(inflightArg)
const RECORD_BYTES = 1024

async function main() {
  const kafka = new Kafka({ clientId: 'neve-probe', brokers: [bootstrap], logLevel: logLevel.NOTHING })
  const admin = kafka.admin()
  await admin.connect()
  await admin.createTopics({ topics: [{ topic, numPartitions: partitions }], waitForLeaders: true, timeout: 60000 })
  await admin.disconnect()

  const producer = kafka.producer({ allowAutoTopicCreation: false })
  await producer.connect()
  const value = Buffer.alloc(RECORD_BYTES, 'x')
  let next = 0
  let acked = 0
  let sends = 0
  const cpuBefore = process.cpuUsage()
  const started = Date.now()
  const end = started + seconds * 1000

  async function lane() {
    while (Date.now() < end) {
      const messages = new Array(perSend)
      for (let i = 0; i < perSend; i++) messages[i] = { value, partition: next++ % partitions }
      await producer.send({ topic, messages, acks: -1 })
      acked += perSend
      sends++
    }
  }
  await Promise.all(Array.from({ length: inflight }, lane))
  const elapsed = (Date.now() - started) / 1000
  const cpu = process.cpuUsage(cpuBefore)
  process.stdout.write(
    JSON.stringify({ partitions, mb_per_s: +((acked * RECORD_BYTES) / elapsed / 1e6).toFixed(2), sends, seconds: elapsed, client_cpu_s: (cpu.user + cpu.system) / 1e6 }) + '\n',
  )
  await producer.disconnect()
}

main().catch((e) => {
  process.stderr.write(`${e.stack || e}\n`)
  process.exit(1)
})
