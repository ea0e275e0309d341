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
//
// Exit codes: 0 success, 1 a record failed or the client threw, 2 timeout, 64 bad usage.

import java.io.BufferedOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
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
                case "consume" -> code = consume(opts, extra, out);
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

    private static int consume(Map<String, String> opts, Properties extra, PrintStream out) {
        String topic = required(opts, "topic");
        int partitions = Integer.parseInt(required(opts, "partitions"));
        long expect = Long.parseLong(opts.getOrDefault("expect", "0"));
        long timeoutMs = Long.parseLong(opts.getOrDefault("timeout-ms", "60000"));
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, required(opts, "bootstrap"));
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, "neve-java-driver");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.putAll(extra);

        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < partitions; p++) {
            tps.add(new TopicPartition(topic, p));
        }
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
        System.err.println("usage: NeveClient produce|consume --bootstrap B --topic T --partitions P "
                + "[--count N] [--expect N] [--timeout-ms MS] [--config key=value]...");
        System.err.println("error: " + why);
        System.exit(USAGE);
    }
}
