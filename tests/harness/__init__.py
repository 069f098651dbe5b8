"""kmirror's test harness: real Kafka clusters for the integration tests and the demo."""
from .kafka_cluster import (KafkaCluster, KafkaError, TOOLS, USERS, SUPER_USER, api_versions,
                            free_port, free_port_block, kafka_libs, kafka_request, kafka_version,
                            metadata_brokers, read_batches, stop_from_state, tool_class, uvarint)
from .process import Daemon, wait_port

__all__ = ["KafkaCluster", "KafkaError", "TOOLS", "USERS", "SUPER_USER", "api_versions",
           "free_port", "free_port_block", "kafka_libs", "kafka_request", "kafka_version",
           "metadata_brokers", "read_batches", "stop_from_state", "tool_class", "uvarint", "Daemon",
           "wait_port"]
