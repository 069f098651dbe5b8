// The latency section's probe (scripts/benchlib/latency.py): produces paced 1 KiB records to one cluster and consumes them from another in one JVM, so send and receive times are on one clock (System.nanoTime).
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/*
 * Arguments are key=value: produce (bootstrap), consume (bootstrap), topic, partitions, rate (MiB/s
 * of record values), size (bytes per record), warmup and measure (seconds), drain (seconds to wait
 * for the last measured records), payload (a file of lines, each at least size bytes), and
 * producer.* / consumer.* client properties (they override the defaults below).
 *
 * A value is: the send time (nanoTime, 8 bytes), the record's sequence number in its phase (8
 * bytes), the phase (1 byte: 0 warm-up, 1 measured), then payload text. The latency of a record is
 * the nanoTime when the consumer's poll returned it minus its send time.
 *
 * stdout, one line each, for the driver: CONFIG producer|consumer {k=v, ...}; READY (consumer at
 * the end of every partition); WARMUP; MEASURE (the measured window begins); SENT n seconds (the
 * last measured record is sent and acknowledged); DRAINED (every measured record seen, or the drain
 * time is up); RESULT k=v ... (the figures).
 */
public class LatencyProbe {
	static final int HEAD = 17;

	static volatile boolean stop;
	static long[] lat;           /* latency + 1 per measured sequence number; 0: not seen */
	static long[] where;         /* partition << 48 | offset where each was first seen */
	static final AtomicLong received = new AtomicLong(), dups = new AtomicLong(), foreign = new AtomicLong();
	static final AtomicLong warmSeen = new AtomicLong();

	static void out(String s) {
		System.out.println(s);
		System.out.flush();
	}

	static long pct(long[] sorted, int n, double q) {
		if (n == 0)
			return -1;
		int i = (int) Math.min(n - 1, Math.floor(q * n));
		return sorted[i];
	}

	/*
	 * The ten slowest records, each with when it was sent (seconds into the measured window), where
	 * it landed and its own ack time: a tail spread over the run is another thing than a stall.
	 */
	static void slowest(long measured, double perSec, long[] ack) {
		Integer[] idx = new Integer[(int) measured];
		int k = 0;
		for (int i = 0; i < measured; i++)
			if (lat[i] != 0)
				idx[k++] = i;
		Integer[] some = Arrays.copyOf(idx, k);
		Arrays.sort(some, (x, y) -> Long.compare(lat[y], lat[x]));
		for (int i = 0; i < Math.min(10, some.length); i++) {
			int q = some[i];
			out(String.format("SLOW seq=%d at_s=%.3f partition=%d offset=%d ms=%.1f ack_ms=%.1f", q, q / perSec,
					  where[q] >>> 48, where[q] & 0xffffffffffffL, (lat[q] - 1) / 1e6, ack[q] / 1e6));
		}
	}

	public static void main(String[] argv) throws Exception {
		Map<String, String> a = new TreeMap<>();
		for (String s : argv) {
			int eq = s.indexOf('=');
			if (eq < 0)
				throw new IllegalArgumentException("not key=value: " + s);
			a.put(s.substring(0, eq), s.substring(eq + 1));
		}
		String topic = a.get("topic");
		int partitions = Integer.parseInt(a.get("partitions"));
		double rateMiB = Double.parseDouble(a.get("rate"));
		int size = Integer.parseInt(a.getOrDefault("size", "1024"));
		double warmup = Double.parseDouble(a.getOrDefault("warmup", "5"));
		double measure = Double.parseDouble(a.get("measure"));
		double drain = Double.parseDouble(a.getOrDefault("drain", "60"));
		double perSec = rateMiB * 1048576.0 / size;

		List<byte[]> lines = new ArrayList<>();
		for (String ln : Files.readAllLines(Paths.get(a.get("payload")), StandardCharsets.US_ASCII)) {
			byte[] b = ln.getBytes(StandardCharsets.US_ASCII);
			if (b.length >= size)
				lines.add(Arrays.copyOf(b, size));
		}
		if (lines.isEmpty())
			throw new IllegalArgumentException("no payload line of " + size + " bytes");

		Properties pp = new Properties();
		pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("produce"));
		pp.put(ProducerConfig.ACKS_CONFIG, "all");
		pp.put(ProducerConfig.LINGER_MS_CONFIG, "5");
		pp.put(ProducerConfig.BATCH_SIZE_CONFIG, "65536");
		pp.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4");
		Properties cp = new Properties();
		cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("consume"));
		cp.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
		cp.put(ConsumerConfig.FETCH_MIN_BYTES_CONFIG, "1");
		cp.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
		cp.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
		cp.put(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG, "1048576");
		cp.put(ConsumerConfig.FETCH_MAX_BYTES_CONFIG, "52428800");
		cp.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_uncommitted");
		cp.put(ConsumerConfig.CHECK_CRCS_CONFIG, "true");
		for (Map.Entry<String, String> e : a.entrySet()) {
			if (e.getKey().startsWith("producer."))
				pp.put(e.getKey().substring(9), e.getValue());
			else if (e.getKey().startsWith("consumer."))
				cp.put(e.getKey().substring(9), e.getValue());
		}
		out("CONFIG producer " + new TreeMap<>(pp));
		out("CONFIG consumer " + new TreeMap<>(cp));
		pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
		pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
		cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
		cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());

		/* Room for every measured record the rate can send, and some over (a late tick catches up). */
		int cap = (int) Math.ceil(perSec * measure * 1.05) + 1024;
		lat = new long[cap];
		where = new long[cap];
		long[] ack = new long[cap];
		AtomicLong acked = new AtomicLong(), sendErrors = new AtomicLong();

		KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(cp);
		List<TopicPartition> tps = new ArrayList<>();
		for (int p = 0; p < partitions; p++)
			tps.add(new TopicPartition(topic, p));
		consumer.assign(tps);
		consumer.seekToEnd(tps);
		for (TopicPartition tp : tps)
			consumer.position(tp, Duration.ofSeconds(60)); /* resolved now, not at the first poll */
		out("READY");

		Thread reader = new Thread(() -> {
			while (!stop) {
				ConsumerRecords<byte[], byte[]> rs = consumer.poll(Duration.ofMillis(100));
				long now = System.nanoTime();
				for (ConsumerRecord<byte[], byte[]> r : rs) {
					byte[] v = r.value();
					if (v == null || v.length < HEAD) {
						foreign.incrementAndGet();
						continue;
					}
					ByteBuffer b = ByteBuffer.wrap(v);
					long sent = b.getLong(0), seq = b.getLong(8);
					if (v[16] == 0) {
						warmSeen.incrementAndGet();
						continue;
					}
					if (v[16] != 1 || seq < 0 || seq >= lat.length) {
						foreign.incrementAndGet();
						continue;
					}
					if (lat[(int) seq] != 0) {
						/* A few of them named, for whoever looks into why. */
						if (dups.incrementAndGet() <= 10)
							out("DUP seq=" + seq + " first=" + (where[(int) seq] >>> 48) + "/" +
							    (where[(int) seq] & 0xffffffffffffL) + " again=" + r.partition() + "/" +
							    r.offset() + " gap_ms=" + (now - sent - lat[(int) seq] + 1) / 1000000);
						continue;
					}
					lat[(int) seq] = now - sent + 1;
					where[(int) seq] = ((long) r.partition() << 48) | r.offset();
					received.incrementAndGet();
				}
			}
		}, "reader");
		reader.start();

		KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp);
		producer.partitionsFor(topic); /* metadata before the clock starts */
		long measured = 0;
		double measuredSecs = 0;
		for (int phase = 0; phase < 2; phase++) {
			double secs = phase == 0 ? warmup : measure;
			if (secs <= 0)
				continue;
			out(phase == 0 ? "WARMUP" : "MEASURE");
			long t0 = System.nanoTime(), end = t0 + (long) (secs * 1e9), seq = 0;
			final int ph = phase;
			/* Paced in ticks of about 1 ms: every record due by now is sent, then a short sleep. */
			for (long now = t0; now < end; now = System.nanoTime()) {
				long due = (long) ((now - t0) / 1e9 * perSec);
				if (ph == 1)
					due = Math.min(due, cap - 1);
				for (; seq < due; seq++) {
					byte[] v = lines.get((int) (seq % lines.size())).clone();
					ByteBuffer b = ByteBuffer.wrap(v);
					final long s = seq, ts = System.nanoTime();
					b.putLong(0, ts);
					b.putLong(8, s);
					v[16] = (byte) ph;
					producer.send(new ProducerRecord<>(topic, v), (md, ex) -> {
						if (ex != null) {
							sendErrors.incrementAndGet();
						} else if (ph == 1) {
							ack[(int) s] = System.nanoTime() - ts;
							acked.incrementAndGet();
						}
					});
				}
				LockSupport.parkNanos(500_000);
			}
			producer.flush();
			if (phase == 1) {
				measured = seq;
				measuredSecs = (System.nanoTime() - t0) / 1e9;
			}
		}
		out("SENT " + measured + " " + measuredSecs);
		long deadline = System.nanoTime() + (long) (drain * 1e9);
		while (received.get() < measured && System.nanoTime() < deadline)
			Thread.sleep(20);
		out("DRAINED");
		/* Duplicates may still arrive a moment later (at-least-once redelivery): a short look. */
		Thread.sleep(500);
		stop = true;
		reader.join(5000);
		producer.close(Duration.ofSeconds(10));
		consumer.close();

		int n = 0;
		long[] got = new long[(int) measured];
		for (int i = 0; i < measured; i++)
			if (lat[i] != 0)
				got[n++] = lat[i] - 1;
		Arrays.sort(got, 0, n);
		slowest(measured, perSec, ack);
		int na = 0;
		long[] acks = new long[(int) measured];
		for (int i = 0; i < measured; i++)
			if (ack[i] != 0)
				acks[na++] = ack[i];
		Arrays.sort(acks, 0, na);
		double sum = 0;
		for (int i = 0; i < n; i++)
			sum += got[i];
		StringBuilder r = new StringBuilder("RESULT");
		r.append(" sent=").append(measured).append(" seconds=").append(measuredSecs);
		r.append(" rate_mib_s=").append(measured * (double) size / 1048576.0 / measuredSecs);
		r.append(" received=").append(n).append(" missing=").append(measured - n);
		r.append(" dups=").append(dups.get()).append(" foreign=").append(foreign.get());
		r.append(" warm_seen=").append(warmSeen.get()).append(" send_errors=").append(sendErrors.get());
		r.append(" p50_us=").append(pct(got, n, 0.50) / 1000.0);
		r.append(" p99_us=").append(pct(got, n, 0.99) / 1000.0);
		r.append(" p999_us=").append(pct(got, n, 0.999) / 1000.0);
		r.append(" max_us=").append(n > 0 ? got[n - 1] / 1000.0 : -1);
		r.append(" mean_us=").append(n > 0 ? sum / n / 1000.0 : -1);
		r.append(" ack_p50_us=").append(pct(acks, na, 0.50) / 1000.0);
		r.append(" ack_p99_us=").append(pct(acks, na, 0.99) / 1000.0);
		out(r.toString());
	}
}
