// One producer (plain, acks=0, idempotent or transactional) writes a record to a read-only mirror topic and one to another topic in the same request; prints what each send reports.
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

public class ReadOnlyProducer {
	private static String outcome(Future<RecordMetadata> f) {
		try {
			RecordMetadata m = f.get();
			return "OK partition=" + m.partition() + " offset=" + m.offset();
		} catch (java.util.concurrent.ExecutionException e) {
			Throwable c = e.getCause();
			return "ERROR " + c.getClass().getName() + ": " + c.getMessage();
		} catch (InterruptedException e) {
			return "ERROR interrupted";
		}
	}

	public static void main(String[] args) {
		String bootstrap = args[0], mode = args[1], roTopic = args[2], okTopic = args[3];
		Properties p = new Properties();
		p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
		p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
		p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
		p.put(ProducerConfig.LINGER_MS_CONFIG, "1000");
		p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "120000");
		p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "30000");
		boolean plain = mode.equals("plain") || mode.equals("acks0");
		p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, plain ? "false" : "true");
		if (plain)
			p.put(ProducerConfig.ACKS_CONFIG, mode.equals("acks0") ? "0" : "1");
		if (mode.equals("txn"))
			p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "ro-" + roTopic);
		try (KafkaProducer<String, String> pr = new KafkaProducer<>(p)) {
			// Metadata first, so the two sends below land in one Produce request.
			pr.partitionsFor(roTopic);
			pr.partitionsFor(okTopic);
			if (mode.equals("txn")) {
				pr.initTransactions();
				pr.beginTransaction();
			}
			long t0 = System.nanoTime();
			Future<RecordMetadata> ro = pr.send(new ProducerRecord<>(roTopic, 0, "k", "to-mirror"));
			Future<RecordMetadata> ok = pr.send(new ProducerRecord<>(okTopic, 0, "k", "to-other"));
			String a = outcome(ro);
			long ms = (System.nanoTime() - t0) / 1000000;
			String b = outcome(ok);
			System.out.println("MIRROR " + a);
			System.out.println("OTHER " + b);
			System.out.println("MS " + ms);
			if (mode.equals("txn")) {
				try {
					pr.commitTransaction();
					System.out.println("COMMIT OK");
				} catch (Exception e) {
					System.out.println("COMMIT ERROR " + e.getClass().getName() + ": " + e.getMessage());
				}
			}
		}
	}
}
