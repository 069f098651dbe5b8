// One produce to a topic through kafkajs, for scripts/client-errors: the producer connects and
// loads the topic's metadata first, then sends one record to partition 0; prints what the
// application gets.
//
// Usage: node produce.js BOOTSTRAP TOPIC plain|idem
// Output, one line each: RESULT OK|ERROR, CLASS (the error's name, type, code, retriable; for
// KafkaJSNumberOfRetriesExceeded, the same of its cause too), TEXT (its message), MS.
'use strict'
const { Kafka, logLevel } = require('kafkajs')

function describe (e) {
  let s = `${e.name} type=${e.type} code=${e.code} retriable=${e.retriable}`
  if (e.originalError) s += ` cause: ${describe(e.originalError)}`
  return s
}

async function main () {
  const [bootstrap, topic, mode] = process.argv.slice(2)
  const idem = mode === 'idem'
  const kafka = new Kafka({
    clientId: 'kmirror-client-errors',
    brokers: bootstrap.split(','),
    logLevel: logLevel.NOTHING
  })
  const producer = kafka.producer({
    idempotent: idem,
    maxInFlightRequests: idem ? 1 : undefined,
    allowAutoTopicCreation: false
  })
  const admin = kafka.admin()
  await admin.connect()
  await admin.fetchTopicMetadata({ topics: [topic] })
  await admin.disconnect()
  await producer.connect()
  const t0 = process.hrtime.bigint()
  let err = null
  try {
    await producer.send({ topic, acks: idem ? -1 : 1, timeout: 10000, messages: [{ value: 'to-mirror', partition: 0 }] })
  } catch (e) {
    err = e
  }
  const ms = Number(process.hrtime.bigint() - t0) / 1e6
  if (err === null) {
    console.log('RESULT OK')
  } else {
    console.log('RESULT ERROR')
    console.log('CLASS ' + describe(err))
    let text = err.message
    if (err.originalError) text += ' / cause: ' + err.originalError.message
    console.log('TEXT ' + text.replace(/\n/g, ' '))
  }
  console.log('MS ' + ms.toFixed(1))
  await producer.disconnect()
}

main().catch(e => {
  console.log('SETUP ' + e)
  process.exit(2)
})
