// One produce to a topic through the Java producer, for scripts/client-errors: the topic's
// metadata first, then one record to partition 0; prints what the application gets.
//
// Usage: Produce BOOTSTRAP TOPIC plain|idem
// Output, one line each: RESULT OK|ERROR, CLASS (the exception's class and, for an ApiException,
// whether it is a RetriableException), TEXT (its message), MS (send to the result).
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.serialization.StringSerializer;

public class Produce {
	public static void main(String[] args) {
		String bootstrap = args[0], topic = args[1], mode = args[2];
		Properties p = new Properties();
		p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
		p.put(ProducerConfig.CLIENT_ID_CONFIG, "kmirror-client-errors");
		p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
		p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
		p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
		p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
		if (mode.equals("plain")) {
			p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
			p.put(ProducerConfig.ACKS_CONFIG, "1");
		} else {
			p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
		}
		try (KafkaProducer<String, String> pr = new KafkaProducer<>(p)) {
			pr.partitionsFor(topic);
			long t0 = System.nanoTime();
			try {
				pr.send(new ProducerRecord<>(topic, 0, null, "to-mirror")).get();
				System.out.println("RESULT OK");
			} catch (ExecutionException e) {
				Throwable c = e.getCause();
				System.out.println("RESULT ERROR");
				System.out.println("CLASS " + c.getClass().getName() + " (retriable " + (c instanceof RetriableException) + ")");
				System.out.println("TEXT " + String.valueOf(c.getMessage()).replace('\n', ' '));
			} catch (InterruptedException e) {
				System.out.println("RESULT INTERRUPTED");
			}
			System.out.printf("MS %.1f%n", (System.nanoTime() - t0) / 1e6);
		}
	}
}
