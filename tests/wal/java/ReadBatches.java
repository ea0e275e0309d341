import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.record.DefaultRecordBatch;
import org.apache.kafka.common.record.MemoryRecords;
import org.apache.kafka.common.record.MutableRecordBatch;
import org.apache.kafka.common.record.Record;

/**
 * The Java client's own reader over a file of concatenated v2 record batches (tests/wal/test_batch_builder.py
 * writes it): each batch is checked (ensureValid: size, CRC-32C), decompressed and iterated as a
 * consumer does, and printed as one line, then one line per record. Bytes are hex ("-" for null).
 * Run as a single-file source program: java -cp <kafka-clients and codec jars> ReadBatches.java FILE
 */
public class ReadBatches {
    static String hex(ByteBuffer buffer) {
        if (buffer == null) return "-";
        StringBuilder out = new StringBuilder("x");
        ByteBuffer b = buffer.duplicate();
        while (b.hasRemaining()) out.append(String.format("%02x", b.get()));
        return out.toString();
    }

    static String hex(byte[] bytes) {
        return bytes == null ? "-" : hex(ByteBuffer.wrap(bytes));
    }

    public static void main(String[] args) throws Exception {
        MemoryRecords records = MemoryRecords.readableRecords(ByteBuffer.wrap(Files.readAllBytes(Path.of(args[0]))));
        StringBuilder out = new StringBuilder();
        for (MutableRecordBatch batch : records.batches()) {
            batch.ensureValid();
            DefaultRecordBatch v2 = (DefaultRecordBatch) batch;
            out.append(String.join(" ", "B", "" + batch.baseOffset(), "" + batch.lastOffset(), "" + batch.partitionLeaderEpoch(),
                "" + batch.magic(), "" + batch.compressionType().id, "" + batch.timestampType().id, "" + batch.isTransactional(),
                "" + batch.isControlBatch(), "" + v2.baseTimestamp(), "" + batch.maxTimestamp(), "" + batch.producerId(),
                "" + batch.producerEpoch(), "" + batch.baseSequence(), "" + batch.countOrNull())).append('\n');
            for (Record record : batch) {
                List<String> fields = new ArrayList<>(List.of("R", "" + record.offset(), "" + record.timestamp(), hex(record.key()), hex(record.value())));
                for (Header header : record.headers()) {
                    fields.add(hex(header.key().getBytes(StandardCharsets.UTF_8)));
                    fields.add(hex(header.value()));
                }
                out.append(String.join(" ", fields)).append('\n');
            }
        }
        System.out.print(out);
    }
}
