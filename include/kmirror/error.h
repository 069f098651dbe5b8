/* kmirror error codes: Kafka's codes verbatim (positive, and -1), internal codes at -1000 and below. */
#ifndef KMIRROR_ERROR_H
#define KMIRROR_ERROR_H

#include <stdbool.h>

typedef int km_err;

enum {
	KM_OK = 0,
	/* Internal codes: never sent on the wire. */
	KM_ERR_NOMEM = -1000,
	KM_ERR_DECODE = -1001,   /* malformed or truncated input */
	KM_ERR_ENCODE = -1002,   /* value does not fit the version being encoded */
	KM_ERR_TOO_LARGE = -1003, /* a size from the wire is over its cap */
	KM_ERR_UNSUPPORTED = -1004, /* api key, version, codec or feature not supported */
	KM_ERR_IO = -1005,
	KM_ERR_CLOSED = -1006,
	KM_ERR_TIMEOUT = -1007,
	KM_ERR_CONFIG = -1008,
	KM_ERR_INVAL = -1009,    /* bad argument from a caller */
	KM_ERR_CRC = -1010,      /* record batch CRC32C mismatch */
	KM_ERR_TLS = -1011,
	KM_ERR_SASL = -1012,
	KM_ERR_FULL = -1013,     /* a bounded queue is full: wait for its writable callback */
};

/* Kafka error codes the code refers to by name (the full table comes from errors.tsv). */
enum {
	KM_KAFKA_UNKNOWN_SERVER_ERROR = -1,
	KM_KAFKA_NONE = 0,
	KM_KAFKA_OFFSET_OUT_OF_RANGE = 1,
	KM_KAFKA_CORRUPT_MESSAGE = 2,
	KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION = 3,
	KM_KAFKA_NOT_LEADER_OR_FOLLOWER = 6,
	KM_KAFKA_INVALID_TOPIC_EXCEPTION = 17,
	KM_KAFKA_INVALID_REQUEST = 42,
	KM_KAFKA_UNSUPPORTED_VERSION = 35,
	KM_KAFKA_COORDINATOR_LOAD_IN_PROGRESS = 14,
	KM_KAFKA_TOPIC_AUTHORIZATION_FAILED = 29,
	KM_KAFKA_CLUSTER_AUTHORIZATION_FAILED = 31,
	KM_KAFKA_TOPIC_ALREADY_EXISTS = 36,
	KM_KAFKA_INVALID_PARTITIONS = 37,
	KM_KAFKA_INVALID_REPLICATION_FACTOR = 38,
	KM_KAFKA_INVALID_REPLICA_ASSIGNMENT = 39,
	KM_KAFKA_INVALID_CONFIG = 40,
	KM_KAFKA_POLICY_VIOLATION = 44,
	KM_KAFKA_SECURITY_DISABLED = 54,
	KM_KAFKA_OPERATION_NOT_ATTEMPTED = 55,
	KM_KAFKA_OFFSET_NOT_AVAILABLE = 78,
};

/*
 * kmirror's own wire codes, for the mirror RPCs and read-only topics (docs/protocol.md). Kafka's
 * codes grow up from 0 (136 in 4.4); these start at 32000 so that no Kafka release reaches them.
 * Stock clients do not know them: the Java client reads them as UNKNOWN_SERVER_ERROR (not
 * retriable) and shows the error message; librdkafka as a permanent error.
 */
enum {
	KM_MIRROR_ERROR_FIRST = 32000,
	KM_MIRROR_READ_ONLY_TOPIC = 32000,
	KM_MIRROR_CLUSTER_MIRROR_ALREADY_EXISTS = 32001,
	KM_MIRROR_UNKNOWN_CLUSTER_MIRROR = 32002,
	KM_MIRROR_TOPIC_ALREADY_IN_CLUSTER_MIRROR = 32003,
	KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR = 32004,
	KM_MIRROR_MIRROR_TOPIC_NOT_PAUSED = 32005,
	KM_MIRROR_INVALID_CLUSTER_MIRROR_STATES = 32006,
	KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG = 32007,
	KM_MIRROR_SECRET_KEY_MISSING = 32008,
	KM_MIRROR_CLUSTER_MIRROR_IN_USE = 32009,
	KM_MIRROR_STATE_UNAVAILABLE = 32010,
};

/* Name of an error: "NOT_LEADER_OR_FOLLOWER", "KM_ERR_DECODE", or "UNKNOWN_CODE". Never NULL. */
const char *km_err_name(km_err err);
/* Kafka's default message for a code, or a short description of an internal code. Never NULL. */
const char *km_err_message(km_err err);
/* Whether a retry may succeed. Unknown Kafka codes are not retriable (the Java client's rule). */
bool km_err_retriable(km_err err);
/* Whether the code is a Kafka code that appears in the table, or one of kmirror's wire codes. */
bool km_err_is_known(km_err err);
/* Whether the code is one of kmirror's own wire codes. */
bool km_err_is_mirror(km_err err);
/* The code of a name ("READ_ONLY_TOPIC", "NOT_LEADER_OR_FOLLOWER"); UNKNOWN_SERVER_ERROR when none. */
km_err km_err_by_name(const char *name);

#endif
