// A share group consumer (KIP-932) for test_mirror_share.py: reads a topic through kmirrord and prints every record.
import java.time.Duration;
import java.util.Base64;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/*
 * Usage: ShareRead BOOTSTRAP GROUP TOPIC EXPECTED IDLE_MS [reset]
 *
 * With "reset" the group's share.auto.offset.reset is set to earliest first (a group config,
 * through the same bootstrap). Then it polls, printing each record as
 * "R partition offset deliveryCount key value" (base64, "-" for null), acknowledging every poll's
 * records (implicit mode) with commitSync, whose failures print as "ACKERR partition error".
 * It stops once EXPECTED records were read and nothing more came for IDLE_MS (so a record too
 * many is seen too), or after IDLE_MS with nothing at all; then "DONE n".
 */
public final class ShareRead {
	private static String b64(byte[] b) {
		return b == null ? "-" : b.length == 0 ? "=" : Base64.getEncoder().encodeToString(b);
	}

	public static void main(String[] args) throws Exception {
		String bootstrap = args[0], group = args[1], topic = args[2];
		long expected = Long.parseLong(args[3]), idleMs = Long.parseLong(args[4]);
		if (args.length > 5 && args[5].equals("reset")) {
			Properties ap = new Properties();
			ap.put("bootstrap.servers", bootstrap);
			try (Admin admin = Admin.create(ap)) {
				ConfigResource res = new ConfigResource(ConfigResource.Type.GROUP, group);
				AlterConfigOp op = new AlterConfigOp(new ConfigEntry("share.auto.offset.reset", "earliest"),
						AlterConfigOp.OpType.SET);
				admin.incrementalAlterConfigs(Map.of(res, List.of(op))).all().get();
			}
		}
		Properties p = new Properties();
		p.put("bootstrap.servers", bootstrap);
		p.put("group.id", group);
		p.put("key.deserializer", ByteArrayDeserializer.class.getName());
		p.put("value.deserializer", ByteArrayDeserializer.class.getName());
		long n = 0;
		try (KafkaShareConsumer<byte[], byte[]> c = new KafkaShareConsumer<>(p)) {
			c.subscribe(Collections.singletonList(topic));
			long last = System.currentTimeMillis();
			long deadline = last + 240_000;
			while (System.currentTimeMillis() < deadline) {
				ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(500));
				for (ConsumerRecord<byte[], byte[]> r : recs) {
					Optional<Short> dc = r.deliveryCount();
					System.out.println("R " + r.partition() + " " + r.offset() + " " + (dc.isPresent() ? dc.get() : -1)
							+ " " + b64(r.key()) + " " + b64(r.value()));
					n++;
				}
				if (!recs.isEmpty()) {
					Map<TopicIdPartition, Optional<KafkaException>> res = c.commitSync();
					for (Map.Entry<TopicIdPartition, Optional<KafkaException>> e : res.entrySet())
						if (e.getValue().isPresent())
							System.out.println("ACKERR " + e.getKey().partition() + " " + e.getValue().get());
					last = System.currentTimeMillis();
				} else if (n >= expected && System.currentTimeMillis() - last >= idleMs) {
					break;
				}
			}
		}
		System.out.println("DONE " + n);
		System.out.flush();
	}
}
