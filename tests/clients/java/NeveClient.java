// The stock Java Kafka client (kafka-clients 3.9.1) as a command-line driver for neve's tests.
// It keeps the client's defaults (idempotence on, acks=all) unless a test passes --config k=v.
//
//   produce --bootstrap B --topic T --count N --partitions P [--config k=v]...
//       sends records 0..N-1 (key = value = the sequence number as text) to partition seq % P and
//       prints one line per acknowledged record: "partition offset seq".
//   consume --bootstrap B --topic T --partitions P [--expect N] [--timeout-ms MS] [--config k=v]...
//       assign() + seekToBeginning(), reads until every partition reaches the end offset it had at
//       start (and at least N records), printing "end partition offset" per partition first, then
//       "partition offset value" per record.
//   produce-keyed --bootstrap B --topic T [--config k=v]...
//       sends the records read on stdin, one a line: "partition TAB key TAB value" with key and
//       value as hex, value "-" for null (a tombstone), in order; prints one JSON line per
//       acknowledged record: {"record": n, "partition": p, "offset": o}, n its line's index from 0.
//   consume-bytes --bootstrap B --topic T --partitions P [--timeout-ms MS] [--config k=v]...
//       every record from offset 0 to each partition's end offset at start, key, value and
//       headers as hex ("-" for null).
//
//   admin --bootstrap B --op OP --topic T [--partitions N] [--config k=v]...
//       one admin operation, answered with one JSON line. Without --op, a session: one operation
//       per stdin line ("op TAB topic TAB partitions [TAB key=value]...") answered by one JSON line
//       each ({"error": "..."} when it failed) until stdin closes. Operations: create (a topic of
//       N partitions with the --config topic configs), describe ({"partitions": [...]}, or
//       {"partitions": null} when the topic does not exist), configs ({"configs": {k: v}}), alter
//       (incremental SET of each --config), partitions (increase to N), delete, list
//       ({"topics": [...]}). In a session the --config pairs are the admin client's own settings
//       (security.protocol, sasl.*, ssl.*), and a line's key=value fields name the security
//       operations' arguments:
//         acl-create: one binding, fields resource_type name pattern_type principal host operation
//           permission (the Java enums' names: TOPIC, PREFIXED, WRITE, ALLOW, ...) -> {}
//         acl-describe / acl-delete: a filter, the same fields, each absent one ANY (host, name,
//           principal: any) -> {"acls": [binding, ...]} (described, or deleted), bindings as JSON
//           objects of those fields, sorted
//         scram-upsert: user (topic field), mechanism (SCRAM_SHA_256|SCRAM_SHA_512), iterations,
//           password -> {}
//         scram-delete: user (topic field), mechanism -> {}
//         scram-describe: the users named in the topic field (comma-separated; empty: every user)
//           -> {"users": {user: [[mechanism, iterations], ...] or null (RESOURCE_NOT_FOUND)}}
//   member --bootstrap B --topic T --group G --batch N [--quota Q] [--timeout-ms MS] [--config k=v]...
//       a consumer-group member (subscribe, auto-commit off). Reads lines on stdin: "quota Q" (the
//       total number of records it may process), "quota none" (no limit), "stop" (close, which
//       leaves the group), "abandon" (process one more batch, report it with error "abandoned:
//       ..." and close without committing it). Prints JSON lines: {"type": "started"} before
//       subscribing; {"type": "assigned"|"revoked", "partitions": [...]} from its rebalance
//       listener; {"type": "batch", "records": [[p, o, value], ...], "error": null|"..."} for each
//       processed batch (at most N records, never beyond the quota: records polled past it are
//       sought back to), committed with commitSync before the next poll (error: why the commit
//       failed); {"type": "closed"} once closed. Past the quota every assigned partition is paused
//       until the quota is raised.
//
// Exit codes: 0 success, 1 a record failed or the client threw, 2 timeout, 64 bad usage.

import java.io.BufferedOutputStream;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialDeletion;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.clients.admin.UserScramCredentialsDescription;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourceType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.clients.consumer.CommitFailedException;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class NeveClient {
    private static final int USAGE = 64;

    public static void main(String[] argv) {
        if (argv.length == 0) {
            usage("missing subcommand");
        }
        Map<String, String> opts = new HashMap<>();
        Properties extra = new Properties();
        for (int i = 1; i < argv.length; i += 2) {
            if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
                usage("bad argument " + argv[i]);
            }
            String name = argv[i].substring(2);
            String value = argv[i + 1];
            if (name.equals("config")) {
                int eq = value.indexOf('=');
                if (eq <= 0) {
                    usage("--config wants key=value, got " + value);
                }
                extra.put(value.substring(0, eq), value.substring(eq + 1));
            } else {
                opts.put(name, value);
            }
        }
        PrintStream out = new PrintStream(new BufferedOutputStream(System.out, 1 << 16), false, StandardCharsets.UTF_8);
        int code;
        try {
            switch (argv[0]) {
                case "produce" -> code = produce(opts, extra, out);
                case "produce-keyed" -> code = produceKeyed(opts, extra, out);
                case "consume" -> code = consume(opts, extra, out);
                case "consume-bytes" -> code = consumeBytes(opts, extra, out);
                case "admin" -> code = admin(opts, extra, out);
                case "member" -> code = member(opts, extra, out);
                case "txn-produce" -> code = txnProduce(opts, extra, out);
                case "transform" -> code = transform(opts, extra, out);
                case "fenced-offsets" -> code = fencedOffsets(opts, extra, out);
                default -> {
                    usage("unknown subcommand " + argv[0]);
                    code = USAGE;
                }
            }
        } catch (Exception e) {
            System.err.println("error: client threw");
            e.printStackTrace(System.err);
            code = 1;
        }
        out.flush();
        System.err.flush();
        System.exit(code);
    }

    private static int produce(Map<String, String> opts, Properties extra, PrintStream out) {
        String topic = required(opts, "topic");
        int count = Integer.parseInt(required(opts, "count"));
        int partitions = Integer.parseInt(required(opts, "partitions"));
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, required(opts, "bootstrap"));
        props.put(ProducerConfig.CLIENT_ID_CONFIG, "neve-java-driver");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.putAll(extra);

        AtomicInteger acked = new AtomicInteger();
        AtomicInteger failed = new AtomicInteger();
        AtomicReference<Exception> firstError = new AtomicReference<>();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            for (int seq = 0; seq < count; seq++) {
                final int s = seq;
                String text = Integer.toString(seq);
                producer.send(new ProducerRecord<>(topic, seq % partitions, text, text), (md, e) -> {
                    if (e != null) {
                        failed.incrementAndGet();
                        firstError.compareAndSet(null, e);
                    } else {
                        acked.incrementAndGet();
                        synchronized (out) {
                            out.print(md.partition());
                            out.print(' ');
                            out.print(md.offset());
                            out.print(' ');
                            out.println(s);
                        }
                    }
                });
            }
            producer.flush();
        }
        if (failed.get() > 0 || acked.get() != count) {
            System.err.printf("error: %d of %d records acknowledged, %d failed%n", acked.get(), count, failed.get());
            if (firstError.get() != null) {
                System.err.println("first failure:");
                firstError.get().printStackTrace(System.err);
            }
            return 1;
        }
        return 0;
    }

    /** Records from stdin ("partition TAB key-hex TAB value-hex or -"), sent in order as bytes; one
     * JSON line per acknowledgement. Fails (1) unless every record is acknowledged. */
    private static int produceKeyed(Map<String, String> opts, Properties extra, PrintStream out) throws java.io.IOException {
        String topic = required(opts, "topic");
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, required(opts, "bootstrap"));
        props.put(ProducerConfig.CLIENT_ID_CONFIG, "neve-java-driver");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.putAll(extra);

        AtomicInteger acked = new AtomicInteger();
        AtomicInteger failed = new AtomicInteger();
        AtomicReference<Exception> firstError = new AtomicReference<>();
        int count = 0;
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isEmpty()) {
                    continue;
                }
                String[] f = line.split("\t", -1);
                if (f.length != 3) {
                    usage("produce-keyed wants \"partition TAB key TAB value\", got " + line);
                }
                final int n = count++;
                byte[] value = f[2].equals("-") ? null : unhex(f[2]);
                producer.send(new ProducerRecord<>(topic, Integer.parseInt(f[0]), unhex(f[1]), value), (md, e) -> {
                    if (e != null) {
                        failed.incrementAndGet();
                        firstError.compareAndSet(null, e);
                    } else {
                        acked.incrementAndGet();
                        synchronized (out) {
                            out.println("{\"record\": " + n + ", \"partition\": " + md.partition() + ", \"offset\": " + md.offset() + "}");
                        }
                    }
                });
            }
            producer.flush();
        }
        if (failed.get() > 0 || acked.get() != count) {
            System.err.printf("error: %d of %d records acknowledged, %d failed%n", acked.get(), count, failed.get());
            if (firstError.get() != null) {
                System.err.println("first failure:");
                firstError.get().printStackTrace(System.err);
            }
            return 1;
        }
        return 0;
    }

    private static byte[] unhex(String text) {
        byte[] data = new byte[text.length() / 2];
        for (int i = 0; i < data.length; i++) {
            data[i] = (byte) Integer.parseInt(text.substring(2 * i, 2 * i + 2), 16);
        }
        return data;
    }

    /** A consumer's properties for the driver's reads: no group commits, `deserializer` for keys and values. */
    private static Properties consumerProps(Map<String, String> opts, Properties extra, Class<?> deserializer) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, required(opts, "bootstrap"));
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, "neve-java-driver");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, deserializer.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, deserializer.getName());
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.putAll(extra);
        return props;
    }

    private static List<TopicPartition> partitionsOf(String topic, int partitions) {
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < partitions; p++) {
            tps.add(new TopicPartition(topic, p));
        }
        return tps;
    }

    private static int consume(Map<String, String> opts, Properties extra, PrintStream out) {
        String topic = required(opts, "topic");
        int partitions = Integer.parseInt(required(opts, "partitions"));
        long expect = Long.parseLong(opts.getOrDefault("expect", "0"));
        long timeoutMs = Long.parseLong(opts.getOrDefault("timeout-ms", "60000"));
        Properties props = consumerProps(opts, extra, StringDeserializer.class);
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        List<TopicPartition> tps = partitionsOf(topic, partitions);
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> end = consumer.endOffsets(tps, Duration.ofMillis(timeoutMs));
            for (TopicPartition tp : tps) {
                out.println("end " + tp.partition() + " " + end.get(tp));
            }
            long read = 0;
            while (read < expect || !reachedEnd(consumer, tps, end)) {
                if (System.nanoTime() > deadline) {
                    StringBuilder where = new StringBuilder();
                    for (TopicPartition tp : tps) {
                        where.append(' ').append(tp.partition()).append(':').append(consumer.position(tp)).append('/').append(end.get(tp));
                    }
                    System.err.printf("error: timeout after %d ms with %d records read (expected %d); position/end:%s%n",
                            timeoutMs, read, expect, where);
                    return 2;
                }
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    out.print(r.partition());
                    out.print(' ');
                    out.print(r.offset());
                    out.print(' ');
                    out.println(r.value());
                    read++;
                }
            }
        }
        return 0;
    }

    /** Every record from offset 0 to each partition's end offset at start, one line each: partition,
     * offset, timestamp type id, timestamp, key, value and headers as hex ("-" for null; headers
     * "name=hex" joined by ",", or "-" for none). */
    private static int consumeBytes(Map<String, String> opts, Properties extra, PrintStream out) {
        String topic = required(opts, "topic");
        int partitions = Integer.parseInt(required(opts, "partitions"));
        long timeoutMs = Long.parseLong(opts.getOrDefault("timeout-ms", "60000"));
        Properties props = consumerProps(opts, extra, ByteArrayDeserializer.class);
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        List<TopicPartition> tps = partitionsOf(topic, partitions);
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> end = consumer.endOffsets(tps, Duration.ofMillis(timeoutMs));
            while (!reachedEnd(consumer, tps, end)) {
                if (System.nanoTime() > deadline) {
                    System.err.printf("error: timeout after %d ms%n", timeoutMs);
                    return 2;
                }
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    StringBuilder headers = new StringBuilder();
                    for (Header h : r.headers()) {
                        headers.append(headers.length() == 0 ? "" : ",").append(h.key()).append('=').append(hex(h.value()));
                    }
                    out.println(r.partition() + " " + r.offset() + " " + r.timestampType().id + " " + r.timestamp() + " "
                            + hex(r.key()) + " " + hex(r.value()) + " " + (headers.length() == 0 ? "-" : headers));
                }
            }
        }
        return 0;
    }

    /** A transactional producer: one transaction per step of --plan ("c30,a20,c10": commit 30
     * records, abort 20, commit 10), the i-th record of transaction n ("t<n>-<i>") going to topic
     * i % topics and partition (i / topics) % partitions. One line per record once its transaction
     * ended: "record committed|aborted topic partition offset value". With --open K, a last
     * transaction of K records is sent, "opened" printed, and it commits when a line arrives on
     * stdin. Ends with "done". */
    private static int txnProduce(Map<String, String> opts, Properties extra, PrintStream out) throws Exception {
        String[] topics = required(opts, "topics").split(",");
        int partitions = Integer.parseInt(required(opts, "partitions"));
        String[] plan = opts.getOrDefault("plan", "").isEmpty() ? new String[0] : opts.get("plan").split(",");
        int open = Integer.parseInt(opts.getOrDefault("open", "0"));
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, required(opts, "bootstrap"));
        props.put(ProducerConfig.CLIENT_ID_CONFIG, "neve-java-txn");
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, required(opts, "transactional-id"));
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.putAll(extra);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            producer.initTransactions();
            int n = 0;
            for (String step : plan) {
                boolean commit = step.charAt(0) == 'c';
                List<String> sent = sendTransaction(producer, topics, partitions, n, Integer.parseInt(step.substring(1)));
                if (commit) {
                    producer.commitTransaction();
                } else {
                    producer.abortTransaction();
                }
                for (String line : sent) {
                    out.println("record " + (commit ? "committed " : "aborted ") + line);
                }
                out.flush();
                n++;
            }
            if (open > 0) {
                List<String> sent = sendTransaction(producer, topics, partitions, n, open);
                out.println("opened");
                out.flush();
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
                producer.commitTransaction();
                for (String line : sent) {
                    out.println("record committed " + line);
                }
            }
        }
        out.println("done");
        return 0;
    }

    private static List<String> sendTransaction(KafkaProducer<String, String> producer, String[] topics, int partitions, int n, int count) throws Exception {
        producer.beginTransaction();
        List<java.util.concurrent.Future<org.apache.kafka.clients.producer.RecordMetadata>> acks = new ArrayList<>();
        List<String> values = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            String value = "t" + n + "-" + i;
            acks.add(producer.send(new ProducerRecord<>(topics[i % topics.length], (i / topics.length) % partitions, value, value)));
            values.add(value);
        }
        producer.flush();
        List<String> lines = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            org.apache.kafka.clients.producer.RecordMetadata md = acks.get(i).get();
            lines.add(md.topic() + " " + md.partition() + " " + md.offset() + " " + values.get(i));
        }
        return lines;
    }

    /** Consume-transform-produce, exactly once: in group --group, read --input (read_committed),
     * write each record's value to --output (same partition) and commit the consumed offsets in the
     * same transaction (sendOffsetsToTransaction). Every --abort-every'th transaction is aborted
     * instead, and its records read again from the group's committed offsets. Prints "txn n
     * committed|aborted count" per transaction; ends with "done" once the group's committed offsets
     * reach the input's end offsets (read at start), or "fenced" when another producer with the
     * same transactional id took over. --pause-ms sleeps after each transaction. With --hold-after
     * N, after N transactions it prints "holding" and stays in the group reading nothing until a
     * line arrives on stdin. */
    private static int transform(Map<String, String> opts, Properties extra, PrintStream out) throws Exception {
        String input = required(opts, "input");
        String output = required(opts, "output");
        int partitions = Integer.parseInt(required(opts, "partitions"));
        int abortEvery = Integer.parseInt(opts.getOrDefault("abort-every", "0"));
        long pauseMs = Long.parseLong(opts.getOrDefault("pause-ms", "0"));
        long timeoutMs = Long.parseLong(opts.getOrDefault("timeout-ms", "120000"));
        int maxPoll = Integer.parseInt(opts.getOrDefault("max-poll", "50"));
        int holdAfter = Integer.parseInt(opts.getOrDefault("hold-after", "0"));
        java.util.concurrent.atomic.AtomicBoolean holding = new java.util.concurrent.atomic.AtomicBoolean(false);
        Properties cprops = new Properties();
        cprops.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, required(opts, "bootstrap"));
        cprops.put(ConsumerConfig.CLIENT_ID_CONFIG, "neve-java-transform");
        cprops.put(ConsumerConfig.GROUP_ID_CONFIG, required(opts, "group"));
        cprops.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        cprops.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        cprops.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        cprops.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, Integer.toString(maxPoll));
        cprops.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        cprops.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        Properties pprops = new Properties();
        pprops.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, required(opts, "bootstrap"));
        pprops.put(ProducerConfig.CLIENT_ID_CONFIG, "neve-java-transform");
        pprops.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, required(opts, "transactional-id"));
        pprops.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pprops.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pprops.putAll(extra);
        List<TopicPartition> tps = partitionsOf(input, partitions);
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cprops);
             KafkaProducer<String, String> producer = new KafkaProducer<>(pprops)) {
            producer.initTransactions();
            Map<TopicPartition, Long> end = consumer.endOffsets(tps, Duration.ofMillis(timeoutMs));
            consumer.subscribe(List.of(input));
            int n = 0;
            while (true) {
                if (System.nanoTime() > deadline) {
                    System.err.printf("error: timeout after %d ms%n", timeoutMs);
                    return 2;
                }
                if (holding.get()) {
                    consumer.pause(consumer.assignment());  // in the group (polling), reading nothing
                } else if (!consumer.paused().isEmpty()) {
                    consumer.resume(consumer.paused());
                }
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (holding.get()) {
                    continue;
                }
                if (records.isEmpty()) {
                    Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(new java.util.HashSet<>(tps), Duration.ofMillis(timeoutMs));
                    boolean all = true;
                    for (TopicPartition tp : tps) {
                        OffsetAndMetadata c = committed.get(tp);
                        all &= c != null && c.offset() >= end.get(tp);
                    }
                    if (all) {
                        out.println("done");
                        return 0;
                    }
                    continue;
                }
                try {
                    producer.beginTransaction();
                    Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                    for (ConsumerRecord<String, String> r : records) {
                        producer.send(new ProducerRecord<>(output, r.partition(), r.key(), r.value()));
                        offsets.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                    }
                    // the records first: a fenced producer's batches fail with ProducerFencedException,
                    // where an offsets request queued behind its fenced AddPartitionsToTxn would wait
                    // out max.block.ms
                    producer.flush();
                    producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
                    boolean abort = abortEvery > 0 && n % abortEvery == abortEvery - 1;
                    if (abort) {
                        producer.abortTransaction();
                        Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(offsets.keySet(), Duration.ofMillis(timeoutMs));
                        for (TopicPartition tp : offsets.keySet()) {
                            OffsetAndMetadata c = committed.get(tp);
                            consumer.seek(tp, c == null ? 0 : c.offset());
                        }
                    } else {
                        producer.commitTransaction();
                    }
                    out.println("txn " + n + (abort ? " aborted " : " committed ") + records.count());
                    out.flush();
                    n++;
                    if (holdAfter > 0 && n == holdAfter) {
                        // hold until a line arrives on stdin: another instance can start meanwhile
                        holding.set(true);
                        Thread reader = new Thread(() -> {
                            try {
                                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
                            } catch (java.io.IOException ignored) {
                                // stdin closed: go on as well
                            }
                            holding.set(false);
                        });
                        reader.setDaemon(true);
                        reader.start();
                        out.println("holding");
                        out.flush();
                    }
                } catch (ProducerFencedException | InvalidProducerEpochException | CommitFailedException e) {
                    out.println("fenced " + e.getClass().getSimpleName());
                    out.flush();
                    return 0;
                } catch (org.apache.kafka.common.KafkaException e) {
                    if (e.getCause() instanceof ProducerFencedException) {
                        out.println("fenced " + e.getCause().getClass().getSimpleName());
                        out.flush();
                        return 0;
                    }
                    throw e;
                }
                if (pauseMs > 0) {
                    Thread.sleep(pauseMs);
                }
            }
        }
    }

    /** A fenced producer's sendOffsetsToTransaction, --rounds times, each on a transactional id of
     * its own: producer A inits, producer B inits with the same id (fencing A), then A begins, sends
     * a record to --topic partition 0 and at once sends offsets for --group. Prints per round
     * "round <i> fenced|timeout|committed <ms> <exception>": whether A was told it is fenced, or
     * its call waited out max.block.ms (--max-block-ms). */
    private static int fencedOffsets(Map<String, String> opts, Properties extra, PrintStream out) throws Exception {
        String topic = required(opts, "topic");
        String group = required(opts, "group");
        int rounds = Integer.parseInt(opts.getOrDefault("rounds", "5"));
        String maxBlock = opts.getOrDefault("max-block-ms", "5000");
        for (int i = 0; i < rounds; i++) {
            String tid = required(opts, "transactional-id") + "-" + i;
            Properties pprops = new Properties();
            pprops.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, required(opts, "bootstrap"));
            pprops.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, tid);
            pprops.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, maxBlock);
            pprops.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            pprops.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            pprops.putAll(extra);
            KafkaProducer<String, String> a = new KafkaProducer<>(pprops);
            KafkaProducer<String, String> b = new KafkaProducer<>(pprops);
            String outcome;
            long start = 0;
            String error = "-";
            try {
                a.initTransactions();
                b.initTransactions();
                a.beginTransaction();
                start = System.nanoTime();
                a.send(new ProducerRecord<>(topic, 0, "k", "v" + i));
                a.sendOffsetsToTransaction(Map.of(new TopicPartition(topic, 0), new OffsetAndMetadata(1)), new ConsumerGroupMetadata(group));
                a.commitTransaction();
                outcome = "committed";
            } catch (ProducerFencedException e) {
                outcome = "fenced";
                error = e.getClass().getSimpleName();
            } catch (org.apache.kafka.common.errors.TimeoutException e) {
                outcome = "timeout";
                error = e.getMessage().replace(' ', '_');
            } catch (org.apache.kafka.common.KafkaException e) {
                outcome = e.getCause() instanceof ProducerFencedException ? "fenced" : "error";
                error = e.getClass().getSimpleName();
            } finally {
                a.close(Duration.ZERO);
                b.close(Duration.ofSeconds(5));
            }
            out.println("round " + i + " " + outcome + " " + (System.nanoTime() - start) / 1_000_000 + " " + error);
            out.flush();
        }
        out.println("done");
        return 0;
    }

    private static String hex(byte[] data) {
        if (data == null) {
            return "-";
        }
        StringBuilder s = new StringBuilder(data.length * 2 + 1).append('x');
        for (byte b : data) {
            s.append(Character.forDigit((b >> 4) & 0xF, 16)).append(Character.forDigit(b & 0xF, 16));
        }
        return s.toString();
    }

    private static final long ADMIN_TIMEOUT_S = 30;
    private static final String ABANDONED = "abandoned: closed before committing";

    private static int admin(Map<String, String> opts, Properties extra, PrintStream out) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, required(opts, "bootstrap"));
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, "neve-java-admin");
        if (!opts.containsKey("op")) {
            props.putAll(extra);  // a session's --config pairs are client settings (one op's are topic configs)
        }
        try (Admin admin = Admin.create(props)) {
            if (opts.containsKey("op")) {
                Map<String, String> configs = new LinkedHashMap<>();
                extra.forEach((k, v) -> configs.put((String) k, (String) v));
                out.println(adminOp(admin, opts.get("op"), opts.getOrDefault("topic", ""), opts.getOrDefault("partitions", ""), configs));
                return 0;
            }
            // A session: one operation per stdin line ("op TAB topic TAB partitions [TAB key=value]..."),
            // one JSON answer line each ({"error": "..."} when it failed), until stdin closes.
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                String[] f = line.split("\t", -1);
                Map<String, String> configs = new LinkedHashMap<>();
                for (int i = 3; i < f.length; i++) {
                    int eq = f[i].indexOf('=');
                    configs.put(f[i].substring(0, eq), f[i].substring(eq + 1));
                }
                String answer;
                try {
                    answer = adminOp(admin, f[0], f.length > 1 ? f[1] : "", f.length > 2 ? f[2] : "", configs);
                } catch (Exception e) {
                    Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
                    answer = "{\"error\": " + json(cause.getClass().getSimpleName() + ": " + cause.getMessage()) + "}";
                }
                out.println(answer);
                out.flush();
            }
        }
        return 0;
    }

    private static String adminOp(Admin admin, String op, String topic, String partitions, Map<String, String> configs) throws Exception {
        ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        switch (op) {
            case "list" -> {
                return "{\"topics\": " + jsonStrings(new TreeSet<>(admin.listTopics().names().get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS))) + "}";
            }
            case "create" -> {
                NewTopic t = new NewTopic(topic, Integer.parseInt(partitions), (short) 1).configs(configs);
                admin.createTopics(List.of(t)).all().get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS);
                return "{}";
            }
            case "describe" -> {
                try {
                    TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS).get(topic);
                    Set<Integer> ids = new TreeSet<>();
                    d.partitions().forEach(p -> ids.add(p.partition()));
                    return "{\"partitions\": " + ids + "}";
                } catch (ExecutionException e) {
                    if (!(e.getCause() instanceof UnknownTopicOrPartitionException)) {
                        throw e;
                    }
                    return "{\"partitions\": null}";
                }
            }
            case "configs" -> {
                Config config = admin.describeConfigs(List.of(resource)).all().get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS).get(resource);
                StringBuilder sb = new StringBuilder("{\"configs\": {");
                String sep = "";
                for (ConfigEntry e : config.entries()) {
                    sb.append(sep).append(json(e.name())).append(": ").append(e.value() == null ? "null" : json(e.value()));
                    sep = ", ";
                }
                return sb.append("}}").toString();
            }
            case "alter" -> {
                List<AlterConfigOp> ops = new ArrayList<>();
                configs.forEach((k, v) -> ops.add(new AlterConfigOp(new ConfigEntry(k, v), AlterConfigOp.OpType.SET)));
                admin.incrementalAlterConfigs(Map.of(resource, ops)).all().get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS);
                return "{}";
            }
            case "partitions" -> {
                admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(Integer.parseInt(partitions)))).all().get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS);
                return "{}";
            }
            case "delete" -> {
                admin.deleteTopics(List.of(topic)).all().get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS);
                return "{}";
            }
            case "acl-create" -> {
                AclBinding binding = new AclBinding(
                        new ResourcePattern(ResourceType.valueOf(configs.get("resource_type")), configs.get("name"), PatternType.valueOf(configs.get("pattern_type"))),
                        new AccessControlEntry(configs.get("principal"), configs.get("host"), AclOperation.valueOf(configs.get("operation")), AclPermissionType.valueOf(configs.get("permission"))));
                admin.createAcls(List.of(binding)).all().get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS);
                return "{}";
            }
            case "acl-describe" -> {
                return "{\"acls\": " + jsonAcls(admin.describeAcls(aclFilter(configs)).values().get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS)) + "}";
            }
            case "acl-delete" -> {
                return "{\"acls\": " + jsonAcls(admin.deleteAcls(List.of(aclFilter(configs))).all().get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS)) + "}";
            }
            case "scram-upsert" -> {
                ScramCredentialInfo info = new ScramCredentialInfo(ScramMechanism.valueOf(configs.get("mechanism")), Integer.parseInt(configs.get("iterations")));
                UserScramCredentialAlteration upsert = new UserScramCredentialUpsertion(topic, info, configs.get("password"));
                admin.alterUserScramCredentials(List.of(upsert)).all().get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS);
                return "{}";
            }
            case "scram-delete" -> {
                UserScramCredentialAlteration deletion = new UserScramCredentialDeletion(topic, ScramMechanism.valueOf(configs.get("mechanism")));
                admin.alterUserScramCredentials(List.of(deletion)).all().get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS);
                return "{}";
            }
            case "scram-describe" -> {
                Map<String, UserScramCredentialsDescription> users = new java.util.TreeMap<>();
                if (topic.isEmpty()) {
                    users.putAll(admin.describeUserScramCredentials().all().get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS));
                } else {
                    // each named user on its own: all() leaves out the ones the broker answered
                    // RESOURCE_NOT_FOUND, which are reported here as null
                    var described = admin.describeUserScramCredentials(List.of(topic.split(",")));
                    for (String user : topic.split(",")) {
                        try {
                            users.put(user, described.description(user).get(ADMIN_TIMEOUT_S, TimeUnit.SECONDS));
                        } catch (ExecutionException e) {
                            if (!(e.getCause() instanceof org.apache.kafka.common.errors.ResourceNotFoundException)) {
                                throw e;
                            }
                            users.put(user, null);
                        }
                    }
                }
                StringBuilder sb = new StringBuilder("{\"users\": {");
                String sep = "";
                for (Map.Entry<String, UserScramCredentialsDescription> e : users.entrySet()) {
                    String infos = "null";
                    if (e.getValue() != null) {
                        List<String> items = new ArrayList<>();
                        for (ScramCredentialInfo info : e.getValue().credentialInfos()) {
                            items.add("[" + json(info.mechanism().name()) + ", " + info.iterations() + "]");
                        }
                        items.sort(null);
                        infos = items.toString();
                    }
                    sb.append(sep).append(json(e.getKey())).append(": ").append(infos);
                    sep = ", ";
                }
                return sb.append("}}").toString();
            }
            default -> throw new IllegalArgumentException("unknown admin op " + op);
        }
    }

    /** An ACL filter from a line's fields: each field not given matches anything. */
    private static AclBindingFilter aclFilter(Map<String, String> f) {
        return new AclBindingFilter(
                new ResourcePatternFilter(ResourceType.valueOf(f.getOrDefault("resource_type", "ANY")), f.get("name"), PatternType.valueOf(f.getOrDefault("pattern_type", "ANY"))),
                new AccessControlEntryFilter(f.get("principal"), f.get("host"), AclOperation.valueOf(f.getOrDefault("operation", "ANY")), AclPermissionType.valueOf(f.getOrDefault("permission", "ANY"))));
    }

    private static String jsonAcls(Collection<AclBinding> bindings) {
        List<String> items = new ArrayList<>();
        for (AclBinding b : bindings) {
            items.add("{\"resource_type\": " + json(b.pattern().resourceType().name()) + ", \"name\": " + json(b.pattern().name())
                    + ", \"pattern_type\": " + json(b.pattern().patternType().name()) + ", \"principal\": " + json(b.entry().principal())
                    + ", \"host\": " + json(b.entry().host()) + ", \"operation\": " + json(b.entry().operation().name())
                    + ", \"permission\": " + json(b.entry().permissionType().name()) + "}");
        }
        items.sort(null);
        return "[" + String.join(", ", items) + "]";
    }

    private static int member(Map<String, String> opts, Properties extra, PrintStream out) throws Exception {
        String topic = required(opts, "topic");
        int batch = Integer.parseInt(required(opts, "batch"));
        long timeoutMs = Long.parseLong(opts.getOrDefault("timeout-ms", "120000"));
        AtomicLong quota = new AtomicLong(parseQuota(opts.getOrDefault("quota", "none")));
        AtomicInteger stop = new AtomicInteger();
        java.util.concurrent.atomic.AtomicBoolean abandon = new java.util.concurrent.atomic.AtomicBoolean();
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, required(opts, "bootstrap"));
        props.put(ConsumerConfig.GROUP_ID_CONFIG, required(opts, "group"));
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, "neve-java-member");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, Integer.toString(batch));
        props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
        props.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "500");
        props.putAll(extra);

        Thread commands = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                String line;
                while ((line = in.readLine()) != null) {
                    String[] words = line.trim().split("\\s+");
                    if (words[0].equals("quota") && words.length == 2) {
                        quota.set(parseQuota(words[1]));
                    } else if (words[0].equals("abandon")) {
                        abandon.set(true);
                    } else if (words[0].equals("stop")) {
                        break;
                    }
                }
            } catch (Exception e) {
                e.printStackTrace(System.err);
            }
            stop.set(1);  // "stop" or stdin closed: the test is gone
        }, "commands");
        commands.setDaemon(true);
        commands.start();

        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        long processed = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            emit(out, "{\"type\": \"started\"}");
            consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                    emit(out, "{\"type\": \"revoked\", \"partitions\": " + partitionIds(partitions) + "}");
                }

                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                    emit(out, "{\"type\": \"assigned\", \"partitions\": " + partitionIds(partitions) + "}");
                }
            });
            while (stop.get() == 0) {
                if (System.nanoTime() > deadline) {
                    System.err.printf("error: member overran %d ms%n", timeoutMs);
                    return 2;
                }
                long room = Math.max(0, quota.get() - processed);
                if (room == 0) {
                    consumer.pause(consumer.assignment());
                } else {
                    consumer.resume(consumer.paused());
                }
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(100));
                if (records.isEmpty()) {
                    continue;
                }
                // Take at most `room` records; each partition with records left over goes back to
                // the first of them, so they are polled again once the quota allows.
                Map<TopicPartition, OffsetAndMetadata> commit = new HashMap<>();
                Map<TopicPartition, Long> rewind = new HashMap<>();
                StringBuilder list = new StringBuilder();
                for (ConsumerRecord<String, String> r : records) {
                    TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                    if (processed >= quota.get() || rewind.containsKey(tp)) {
                        rewind.putIfAbsent(tp, r.offset());
                        continue;
                    }
                    processed++;
                    commit.put(tp, new OffsetAndMetadata(r.offset() + 1));
                    list.append(list.length() == 0 ? "" : ", ").append('[').append(r.partition()).append(", ")
                            .append(r.offset()).append(", ").append(json(r.value())).append(']');
                }
                rewind.forEach(consumer::seek);
                if (commit.isEmpty()) {
                    continue;
                }
                if (abandon.get()) {
                    emit(out, "{\"type\": \"batch\", \"records\": [" + list + "], \"error\": " + json(ABANDONED) + "}");
                    break;
                }
                String error = "null";
                try {
                    consumer.commitSync(commit);
                } catch (Exception e) {
                    error = json(e.getClass().getSimpleName() + ": " + e.getMessage());
                }
                emit(out, "{\"type\": \"batch\", \"records\": [" + list + "], \"error\": " + error + "}");
            }
        }
        emit(out, "{\"type\": \"closed\"}");
        return 0;
    }

    private static long parseQuota(String text) {
        return text.equals("none") ? Long.MAX_VALUE : Long.parseLong(text);
    }

    private static void emit(PrintStream out, String line) {
        synchronized (out) {
            out.println(line);
            out.flush();
        }
    }

    private static String partitionIds(Collection<TopicPartition> partitions) {
        Set<Integer> ids = new TreeSet<>();
        partitions.forEach(tp -> ids.add(tp.partition()));
        return ids.toString();
    }

    private static String jsonStrings(Collection<String> values) {
        StringBuilder sb = new StringBuilder("[");
        String sep = "";
        for (String v : values) {
            sb.append(sep).append(json(v));
            sep = ", ";
        }
        return sb.append(']').toString();
    }

    private static String json(String text) {
        StringBuilder sb = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            switch (c) {
                case '"' -> sb.append("\\\"");
                case '\\' -> sb.append("\\\\");
                default -> {
                    if (c < 0x20) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
                }
            }
        }
        return sb.append('"').toString();
    }

    private static boolean reachedEnd(KafkaConsumer<?, ?> consumer, List<TopicPartition> tps, Map<TopicPartition, Long> end) {
        for (TopicPartition tp : tps) {
            if (consumer.position(tp) < end.get(tp)) {
                return false;
            }
        }
        return true;
    }

    private static String required(Map<String, String> opts, String name) {
        String value = opts.get(name);
        if (value == null) {
            usage("missing --" + name);
        }
        return value;
    }

    private static void usage(String why) {
        System.err.println("usage: NeveClient produce|produce-keyed|consume|consume-bytes|admin|member --bootstrap B --topic T [--partitions P] "
                + "[--count N] [--expect N] [--op OP] [--group G] [--batch N] [--quota Q] [--timeout-ms MS] [--config key=value]...");
        System.err.println("error: " + why);
        System.exit(USAGE);
    }
}
