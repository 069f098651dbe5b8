// A Java transactional producer for the integration tests, compiled at test time against the
// libs directory of the Kafka release under test (so the client is the broker's own version).
//
// Usage: java -cp DIR:libs/* TxnProducer BOOTSTRAP TOPIC TRANSACTIONAL_ID PLAN
//   PLAN: comma-separated OUTCOME:COUNT steps, e.g. commit:100,abort:80,commit:50
// Step k sends COUNT records keyed 0..COUNT-1 with the values "t<k>-<outcome>-<i>", waits for
// every send, then commits or aborts. Prints one "t<k> <outcome> <count>" line per step
// and "done"; any failure is a stack trace and exit status 1.
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

public class TxnProducer {
    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: TxnProducer BOOTSTRAP TOPIC TRANSACTIONAL_ID PLAN");
            System.exit(2);
        }
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, args[2]);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "60000");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "60000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        String topic = args[1];
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            int k = 0;
            for (String step : args[3].split(",")) {
                String[] s = step.split(":");
                String outcome = s[0];
                int n = Integer.parseInt(s[1]);
                k++;
                producer.beginTransaction();
                List<Future<RecordMetadata>> sent = new ArrayList<>();
                for (int i = 0; i < n; i++)
                    sent.add(producer.send(new ProducerRecord<>(topic, Integer.toString(i),
                            "t" + k + "-" + outcome + "-" + i)));
                producer.flush();
                for (Future<RecordMetadata> f : sent)
                    f.get();
                if (outcome.equals("commit"))
                    producer.commitTransaction();
                else if (outcome.equals("abort"))
                    producer.abortTransaction();
                else
                    throw new IllegalArgumentException("outcome must be commit or abort: " + step);
                System.out.println("t" + k + " " + outcome + " " + n);
                System.out.flush();
            }
        }
        System.out.println("done");
    }
}
