// kafkajs (npm, pinned in package-lock.json) as a command-line driver for neve's tests.
// Driven by tests/clients/kafkajs_client.py: one JSON command as argv[2], JSON on stdout.
//
// One-shot commands print one JSON object and exit 0 (exit 1 with {"error": ...} when the client throws):
//   {"op": "create_topic", "bootstrap", "topic", "partitions", "configs": {k: v}}
//   {"op": "describe_topic", "bootstrap", "topic"}            -> {"partitions": [0, 1, ...]} or {"partitions": null}
//   {"op": "list_topics", "bootstrap"}                        -> {"topics": [...]}
//   {"op": "describe_configs", "bootstrap", "topic"}          -> {"configs": {k: v}}
//   {"op": "alter_configs", "bootstrap", "topic", "configs"}  (AlterConfigs: kafkajs has no incremental form)
//   {"op": "create_partitions", "bootstrap", "topic", "count"}
//   {"op": "delete_topic", "bootstrap", "topic"}
//   {"op": "produce", "bootstrap", "topic", "count", "partitions", "chunk"}
//       idempotent producer, acks=all, maxInFlightRequests 5; records 0..count-1 (key = value = the
//       sequence number as text) to partition seq % partitions, sent in chunks of `chunk` records.
//       -> {"acks": [[partition, offset, seq], ...]}
//   {"op": "consume_all", "bootstrap", "topic", "timeout_ms"}
//       a consumer (its own new group, no commits) reading from offset 0 to each partition's end
//       offset, queried first (ListOffsets latest) -> {"end": {partition: offset}, "records":
//       [[partition, offset, key hex|null, value hex|null], ...] in arrival order, "short":
//       {partition: next offset}}. kafkajs skips an empty record batch without moving its fetch
//       offset past it, so a partition whose last records were removed (compaction) never
//       reaches its end offset: such a partition is reported in "short" once QUIET_FETCHES fetches
//       in a row brought no record at all.
//
// One long-lived command: a consumer-group member.
//   {"op": "member", "bootstrap", "topic", "group", "batch", "quota", "session_timeout_ms", "timeout_ms"}
//   Reads lines on stdin: "quota N" (total records it may process), "quota none" (no limit) and
//   "stop" (disconnect, which leaves the group) and "abandon" (process one more batch, report it
//   with error "abandoned: ..." and close without committing it, like a consumer that dies between
//   processing and committing). Prints JSON lines:
//     {"type": "assigned", "partitions": [...]}       after each join (the member's whole assignment)
//     {"type": "batch", "records": [[p, o, value], ...], "error": null|"..."}
//         records processed (at most `batch` at a time, never beyond the quota), then committed
//         synchronously; error is the commit's failure if it failed
//     {"type": "closed"}                              after the member left the group
//     {"type": "started"}                             connected, about to subscribe
//   Auto-commit is off; past the quota every partition is paused until the quota is raised.
//
// Every command may carry "security" (absent: PLAINTEXT):
//   {"ssl": {"ca": file, "cert": file, "key": file}, "sasl": {"mechanism", "username", "password"}}
//   ssl: TLS to the broker, trusting the authority in `ca`, presenting `cert`/`key` when given
//   (mutual TLS); sasl: SASL with kafkajs's mechanism names (plain, scram-sha-256, scram-sha-512).
//
// kafkajs logs go to stderr (the wrapper keeps them in a file); stdout carries only JSON.

'use strict'

const fs = require('fs')
const readline = require('readline')
const { Kafka, logLevel, ConfigResourceTypes } = require('kafkajs')

function security(cmd) {
  const { ssl, sasl } = cmd.security || {}
  const out = {}
  if (ssl) {
    out.ssl = { ca: [fs.readFileSync(ssl.ca, 'utf-8')], rejectUnauthorized: true }
    if (ssl.cert) out.ssl.cert = fs.readFileSync(ssl.cert, 'utf-8')
    if (ssl.key) out.ssl.key = fs.readFileSync(ssl.key, 'utf-8')
  }
  if (sasl) out.sasl = { mechanism: sasl.mechanism, username: sasl.username, password: sasl.password }
  return out
}

function client(cmd, clientId) {
  return new Kafka({
    clientId,
    brokers: [cmd.bootstrap],
    ...security(cmd),
    logLevel: logLevel.INFO,
    logCreator: () => ({ namespace, level, label, log }) => {
      process.stderr.write(`${label} ${namespace} ${JSON.stringify(log)}\n`)
    },
    retry: { retries: 8, initialRetryTime: 100, maxRetryTime: 2000 },
  })
}

const ABANDONED = 'abandoned: closed before committing'

function print(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n')
}

async function withAdmin(cmd, fn) {
  const admin = client(cmd, 'neve-kafkajs-admin').admin()
  await admin.connect()
  try {
    return await fn(admin)
  } finally {
    await admin.disconnect()
  }
}

const ADMIN = {
  async create_topic(cmd, admin) {
    const configEntries = Object.entries(cmd.configs || {}).map(([name, value]) => ({ name, value: String(value) }))
    const created = await admin.createTopics({
      topics: [{ topic: cmd.topic, numPartitions: cmd.partitions, replicationFactor: 1, configEntries }],
      waitForLeaders: true,
      timeout: 30000,
    })
    if (!created) throw new Error(`createTopics answered false: ${cmd.topic} already exists`)
    return {}
  },
  async describe_topic(cmd, admin) {
    const topics = await admin.listTopics()
    if (!topics.includes(cmd.topic)) return { partitions: null }
    const { topics: described } = await admin.fetchTopicMetadata({ topics: [cmd.topic] })
    return { partitions: described[0].partitions.map(p => p.partitionId).sort((a, b) => a - b) }
  },
  async list_topics(cmd, admin) {
    return { topics: await admin.listTopics() }
  },
  async describe_configs(cmd, admin) {
    const { resources } = await admin.describeConfigs({
      resources: [{ type: ConfigResourceTypes.TOPIC, name: cmd.topic }],
      includeSynonyms: false,
    })
    const resource = resources[0]
    if (resource.errorCode !== 0) throw new Error(`describeConfigs: error ${resource.errorCode} ${resource.errorMessage}`)
    return { configs: Object.fromEntries(resource.configEntries.map(e => [e.configName, e.configValue])) }
  },
  async alter_configs(cmd, admin) {
    const configEntries = Object.entries(cmd.configs).map(([name, value]) => ({ name, value: String(value) }))
    const { resources } = await admin.alterConfigs({
      resources: [{ type: ConfigResourceTypes.TOPIC, name: cmd.topic, configEntries }],
    })
    if (resources[0].errorCode !== 0) throw new Error(`alterConfigs: error ${resources[0].errorCode} ${resources[0].errorMessage}`)
    return {}
  },
  async create_partitions(cmd, admin) {
    await admin.createPartitions({ topicPartitions: [{ topic: cmd.topic, count: cmd.count }], timeout: 30000 })
    return {}
  },
  async delete_topic(cmd, admin) {
    await admin.deleteTopics({ topics: [cmd.topic], timeout: 30000 })
    return {}
  },
}

async function produce(cmd) {
  const producer = client(cmd, 'neve-kafkajs-producer').producer({ idempotent: true, maxInFlightRequests: 5 })
  await producer.connect()
  const acks = []
  try {
    // kafkajs numbers an idempotent producer's batches when it sends them and advances the
    // sequence only on success, so concurrent sends to one partition would reuse sequence numbers:
    // each chunk is awaited before the next (one request carries every partition's batch).
    for (let start = 0; start < cmd.count; start += cmd.chunk) {
      const end = Math.min(cmd.count, start + cmd.chunk)
      const byPartition = new Map()
      for (let seq = start; seq < end; seq++) {
        const p = seq % cmd.partitions
        if (!byPartition.has(p)) byPartition.set(p, [])
        byPartition.get(p).push(seq)
      }
      const topicMessages = [{
        topic: cmd.topic,
        messages: [...byPartition.values()].flat().map(seq => ({ key: String(seq), value: String(seq), partition: seq % cmd.partitions })),
      }]
      const results = await producer.sendBatch({ topicMessages, acks: -1 })
      for (const r of results) {
        if (r.errorCode !== 0) throw new Error(`produce to ${r.topicName}/${r.partition}: error ${r.errorCode}`)
        const base = BigInt(r.baseOffset)
        byPartition.get(r.partition).forEach((seq, i) => acks.push([r.partition, Number(base + BigInt(i)), seq]))
      }
    }
  } finally {
    await producer.disconnect()
  }
  return { acks }
}

// A transactional producer (producer.transaction()): one transaction per step of cmd.plan
// ("c30,a20,c10": commit 30 records, abort 20, ...), the i-th record of transaction n ("t<n>-<i>")
// to topic i % topics and partition (i / topics) % partitions, sent in one sendBatch. Answers every
// record with its transaction's outcome and offset.
async function txnProduce(cmd) {
  const producer = client(cmd, 'neve-kafkajs-txn').producer({ transactionalId: cmd.transactional_id, idempotent: true, maxInFlightRequests: 1 })
  await producer.connect()
  const records = []
  try {
    const steps = cmd.plan.split(',')
    for (let n = 0; n < steps.length; n++) {
      const commit = steps[n][0] === 'c'
      const count = Number(steps[n].slice(1))
      const txn = await producer.transaction()
      const byTarget = new Map()
      for (let i = 0; i < count; i++) {
        const topic = cmd.topics[i % cmd.topics.length]
        const partition = Math.floor(i / cmd.topics.length) % cmd.partitions
        const key = `${topic}/${partition}`
        if (!byTarget.has(key)) byTarget.set(key, [])
        byTarget.get(key).push(`t${n}-${i}`)
      }
      const topicMessages = cmd.topics.map(topic => ({
        topic,
        messages: [...byTarget.entries()].filter(([k]) => k.startsWith(`${topic}/`)).flatMap(([k, values]) => values.map(v => ({ key: v, value: v, partition: Number(k.slice(topic.length + 1)) }))),
      }))
      const results = await txn.sendBatch({ topicMessages, acks: -1 })
      if (commit) await txn.commit()
      else await txn.abort()
      for (const r of results) {
        if (r.errorCode !== 0) throw new Error(`produce to ${r.topicName}/${r.partition}: error ${r.errorCode}`)
        const base = BigInt(r.baseOffset)
        byTarget.get(`${r.topicName}/${r.partition}`).forEach((v, i) => records.push([commit ? 'committed' : 'aborted', r.topicName, r.partition, Number(base + BigInt(i)), v]))
      }
    }
  } finally {
    await producer.disconnect()
  }
  return { records }
}

const QUIET_FETCHES = 6

async function consumeAll(cmd) {
  const kafka = client(cmd, 'neve-kafkajs-reader')
  const ends = await withAdmin(cmd, admin => admin.fetchTopicOffsets(cmd.topic))
  const end = Object.fromEntries(ends.map(p => [p.partition, Number(p.high)]))
  const next = Object.fromEntries(ends.map(p => [p.partition, 0]))
  const open = () => Object.keys(end).filter(p => next[p] < end[p])
  const records = []
  if (open().length === 0) return { end, records, short: {} }
  const consumer = kafka.consumer({ groupId: `neve-reader-${process.pid}-${Date.now()}`, maxWaitTimeInMs: 200 })
  let quiet = 0
  let finish
  const finished = new Promise(resolve => { finish = resolve })
  const hardStop = setTimeout(() => finish(new Error(`consume_all overran ${cmd.timeout_ms} ms; next offsets ${JSON.stringify(next)}, ends ${JSON.stringify(end)}`)), cmd.timeout_ms || 60000)
  consumer.on(consumer.events.FETCH, () => {
    if (open().length === 0) finish(null)
    else if (++quiet >= QUIET_FETCHES) finish(null)
  })
  consumer.on(consumer.events.CRASH, ({ payload }) => finish(payload.error))
  await consumer.connect()
  try {
    await consumer.subscribe({ topics: [cmd.topic], fromBeginning: true })
    await consumer.run({
      autoCommit: false,
      eachBatch: async ({ batch }) => {
        for (const m of batch.messages) {
          records.push([batch.partition, Number(m.offset), m.key === null ? null : m.key.toString('hex'), m.value === null ? null : m.value.toString('hex')])
          next[batch.partition] = Number(m.offset) + 1
          quiet = 0
        }
      },
    })
    const error = await finished
    if (error) throw error
  } finally {
    clearTimeout(hardStop)
    await consumer.disconnect()
  }
  return { end, records, short: Object.fromEntries(open().map(p => [p, next[p]])) }
}

async function member(cmd) {
  const kafka = client(cmd, 'neve-kafkajs-member')
  const consumer = kafka.consumer({
    groupId: cmd.group,
    sessionTimeout: cmd.session_timeout_ms || 10000,
    rebalanceTimeout: 30000,
    heartbeatInterval: 500,
    maxWaitTimeInMs: 200,
    retry: { retries: 8, initialRetryTime: 100, maxRetryTime: 2000 },
  })
  let quota = cmd.quota === undefined ? null : cmd.quota
  let processed = 0
  let stopping = false
  let paused = false
  let abandon = false
  let abandoned = false
  const hardStop = setTimeout(() => {
    process.stderr.write(`error: member overran ${cmd.timeout_ms} ms\n`)
    exit(2)
  }, cmd.timeout_ms || 120000)

  const room = () => (quota === null ? Infinity : Math.max(0, quota - processed))
  const applyQuota = () => {
    const shouldPause = room() === 0
    if (shouldPause && !paused) consumer.pause([{ topic: cmd.topic }])
    if (!shouldPause && paused) consumer.resume([{ topic: cmd.topic }])
    paused = shouldPause
  }

  let finish
  const finished = new Promise(resolve => { finish = resolve })
  const stop = async () => {
    if (stopping) return
    stopping = true
    try {
      await consumer.disconnect()
      print({ type: 'closed' })
    } finally {
      clearTimeout(hardStop)
      finish()
    }
  }

  readline.createInterface({ input: process.stdin }).on('line', line => {
    const [word, arg] = line.trim().split(/\s+/)
    if (word === 'quota') {
      quota = arg === 'none' ? null : Number(arg)
      applyQuota()
    } else if (word === 'abandon') {
      abandon = true
    } else if (word === 'stop') {
      stop()
    }
  })

  consumer.on(consumer.events.GROUP_JOIN, ({ payload }) => {
    const mine = payload.memberAssignment[cmd.topic] || []
    print({ type: 'assigned', partitions: [...mine].sort((a, b) => a - b) })
  })
  consumer.on(consumer.events.CRASH, ({ payload }) => {
    process.stderr.write(`consumer crashed: ${payload.error && payload.error.stack}\n`)
  })

  await consumer.connect()
  print({ type: 'started' })
  await consumer.subscribe({ topics: [cmd.topic], fromBeginning: true })
  applyQuota()
  await consumer.run({
    autoCommit: false,
    eachBatchAutoResolve: false,
    eachBatch: async ({ batch, resolveOffset, isRunning, isStale }) => {
      if (!isRunning() || isStale() || stopping || abandoned) return
      // What is not processed here is fetched again from the last resolved offset.
      const take = batch.messages.slice(0, Math.min(cmd.batch, room()))
      if (take.length === 0) return
      processed += take.length
      const records = take.map(m => [batch.partition, Number(m.offset), m.value.toString()])
      if (abandon) {
        abandoned = true  // later batches of this fetch are left alone, then the member closes
        print({ type: 'batch', records, error: ABANDONED })
        setImmediate(stop)
        return
      }
      const last = take[take.length - 1].offset
      resolveOffset(last)
      let error = null
      try {
        await consumer.commitOffsets([{ topic: batch.topic, partition: batch.partition, offset: (BigInt(last) + 1n).toString() }])
      } catch (e) {
        error = `${e.name}: ${e.message}`
      }
      print({ type: 'batch', records, error })
      applyQuota()
    },
  })
  await finished
}

async function main() {
  const cmd = JSON.parse(process.argv[2])
  if (cmd.op === 'member') {
    await member(cmd)
  } else if (cmd.op === 'produce') {
    print(await produce(cmd))
  } else if (cmd.op === 'consume_all') {
    print(await consumeAll(cmd))
  } else if (cmd.op === 'txn_produce') {
    print(await txnProduce(cmd))
  } else if (ADMIN[cmd.op]) {
    print(await withAdmin(cmd, admin => ADMIN[cmd.op](cmd, admin)))
  } else {
    throw new Error(`unknown op ${cmd.op}`)
  }
}

// Exit only once stdout is flushed: a pipe is written asynchronously, and process.exit() would cut
// a long answer short.
const exit = code => process.stdout.write('', () => process.exit(code))

main().then(
  () => exit(0),
  e => {
    process.stderr.write(`error: ${e && e.stack}\n`)
    print({ error: `${e && e.name}: ${e && e.message}` })
    exit(1)
  },
)
