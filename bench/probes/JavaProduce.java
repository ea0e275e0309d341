// A probe, not a scenario: how fast the stock Java producer (kafka-clients, which puts every
// partition's batch for a broker into one ProduceRequest) produces to a running broker at a given
// partition count, records sent to each partition in turn. See bench/probes/README.md.
//
//   java -cp CLASSES:KAFKA_JARS JavaProduce BOOTSTRAP TOPIC PARTITIONS WARMUP_S MEASURE_S [key=value ...]
//
// Creates TOPIC, produces 1 KiB records as fast as the producer accepts them, and prints one JSON
// line: acknowledged MB/s over the measured window (after the warm-up), and this process's CPU
// seconds over that window. Producer settings start from the benchmark's librdkafka defaults
// (acks=all, linger.ms=100, batch.size=1000000, no compression, 32 MiB buffer); key=value
// arguments override them.

import java.lang.management.ManagementFactory;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class JavaProduce {
    static final int RECORD_BYTES = 1024;

    public static void main(String[] args) throws Exception {
        if (args.length < 5) {
            System.err.println("usage: JavaProduce BOOTSTRAP TOPIC PARTITIONS WARMUP_S MEASURE_S [key=value ...]");
            System.exit(2);
        }
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        double warmup = Double.parseDouble(args[3]);
        double measure = Double.parseDouble(args[4]);

        Properties admin = new Properties();
        admin.put("bootstrap.servers", bootstrap);
        try (Admin a = Admin.create(admin)) {
            a.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
        }

        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("acks", "all");
        p.put("linger.ms", "100");
        p.put("batch.size", "1000000");
        p.put("compression.type", "none");
        p.put("buffer.memory", String.valueOf(32 * 1024 * 1024));
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        for (int i = 5; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            p.put(kv[0], kv[1]);
        }

        byte[] value = new byte[RECORD_BYTES];
        AtomicLong acked = new AtomicLong();
        AtomicLong failed = new AtomicLong();
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            long start = System.nanoTime();
            long measureFrom = start + (long) (warmup * 1e9);
            long end = measureFrom + (long) (measure * 1e9);
            long ackedAtStart = -1;
            long cpuAtStart = 0;
            long i = 0;
            while (System.nanoTime() < end) {
                if (ackedAtStart < 0 && System.nanoTime() >= measureFrom) {
                    ackedAtStart = acked.get();
                    cpuAtStart = os.getProcessCpuTime();
                }
                producer.send(new ProducerRecord<>(topic, (int) (i++ % partitions), null, value), (md, e) -> {
                    if (e == null) acked.incrementAndGet();
                    else failed.incrementAndGet();
                });
            }
            long ackedInWindow = acked.get() - ackedAtStart;
            double cpu = (os.getProcessCpuTime() - cpuAtStart) / 1e9;
            producer.flush();
            System.out.printf(
                "{\"partitions\": %d, \"mb_per_s\": %.2f, \"acked\": %d, \"failed\": %d, \"measure_s\": %.1f, \"client_cpu_s\": %.2f}%n",
                partitions, ackedInWindow * (double) RECORD_BYTES / measure / 1e6, acked.get(), failed.get(), measure, cpu);
        }
    }
}
