/* Error names, messages and the retriable classification (Kafka's table from errors.tsv). */
#include <stddef.h>
#include <string.h>

#include "kmirror/error.h"

struct kafka_error {
	int code;
	const char *name;
	bool retriable;
	const char *message;
};

static const struct kafka_error kafka_errors[] = {
#define KM_KAFKA_ERROR(code, name, retriable, message) {code, name, retriable, message},
#include "core/kafka_errors.inc"
#undef KM_KAFKA_ERROR
};

/* kmirror's own wire codes (docs/protocol.md), far above Kafka's so that they never collide. Sorted. */
static const struct kafka_error mirror_errors[] = {
	{KM_MIRROR_READ_ONLY_TOPIC, "READ_ONLY_TOPIC", false,
	 "The topic is mirrored from another cluster and is read-only until its mirroring is stopped."},
	{KM_MIRROR_CLUSTER_MIRROR_ALREADY_EXISTS, "CLUSTER_MIRROR_ALREADY_EXISTS", false,
	 "A mirror with this name already exists."},
	{KM_MIRROR_UNKNOWN_CLUSTER_MIRROR, "UNKNOWN_CLUSTER_MIRROR", false, "No mirror has this name."},
	{KM_MIRROR_TOPIC_ALREADY_IN_CLUSTER_MIRROR, "TOPIC_ALREADY_IN_CLUSTER_MIRROR", false,
	 "The topic is already mirrored."},
	{KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR, "TOPIC_NOT_IN_CLUSTER_MIRROR", false,
	 "The topic is not mirrored by this mirror."},
	{KM_MIRROR_MIRROR_TOPIC_NOT_PAUSED, "MIRROR_TOPIC_NOT_PAUSED", false, "The mirror topic is not paused."},
	{KM_MIRROR_INVALID_CLUSTER_MIRROR_STATES, "INVALID_CLUSTER_MIRROR_STATES", false,
	 "The topic's mirror state does not allow this operation."},
	{KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG, "INVALID_CLUSTER_MIRROR_CONFIG", false,
	 "The mirror configuration is invalid."},
	{KM_MIRROR_SECRET_KEY_MISSING, "CLUSTER_MIRROR_SECRET_KEY_MISSING", false,
	 "kmirrord has no secret key (mirror_secret_key_file) to encrypt the mirror's secrets with."},
	{KM_MIRROR_CLUSTER_MIRROR_IN_USE, "CLUSTER_MIRROR_IN_USE", false,
	 "The mirror still has topics that are not stopped."},
	{KM_MIRROR_STATE_UNAVAILABLE, "MIRROR_STATE_UNAVAILABLE", true,
	 "kmirrord could not read or write __mirror_state; retry."},
};

static const struct {
	km_err code;
	const char *name;
	const char *message;
} internal_errors[] = {
	{KM_ERR_NOMEM, "KM_ERR_NOMEM", "out of memory"},
	{KM_ERR_DECODE, "KM_ERR_DECODE", "malformed or truncated input"},
	{KM_ERR_ENCODE, "KM_ERR_ENCODE", "value cannot be encoded in this version"},
	{KM_ERR_TOO_LARGE, "KM_ERR_TOO_LARGE", "size over its limit"},
	{KM_ERR_UNSUPPORTED, "KM_ERR_UNSUPPORTED", "not supported"},
	{KM_ERR_IO, "KM_ERR_IO", "I/O error"},
	{KM_ERR_CLOSED, "KM_ERR_CLOSED", "connection closed"},
	{KM_ERR_TIMEOUT, "KM_ERR_TIMEOUT", "timed out"},
	{KM_ERR_CONFIG, "KM_ERR_CONFIG", "invalid configuration"},
	{KM_ERR_INVAL, "KM_ERR_INVAL", "invalid argument"},
	{KM_ERR_CRC, "KM_ERR_CRC", "record batch CRC mismatch"},
	{KM_ERR_TLS, "KM_ERR_TLS", "TLS error"},
	{KM_ERR_SASL, "KM_ERR_SASL", "SASL authentication error"},
	{KM_ERR_FULL, "KM_ERR_FULL", "queue full"},
};

#define N_KAFKA (sizeof(kafka_errors) / sizeof(kafka_errors[0]))
#define N_INTERNAL (sizeof(internal_errors) / sizeof(internal_errors[0]))
#define N_MIRROR (sizeof(mirror_errors) / sizeof(mirror_errors[0]))

static const struct kafka_error *kafka_lookup(km_err err)
{
	size_t lo = 0, hi = N_KAFKA;

	if (err >= KM_MIRROR_ERROR_FIRST) {
		for (size_t i = 0; i < N_MIRROR; i++)
			if (mirror_errors[i].code == err)
				return &mirror_errors[i];
		return NULL;
	}
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (kafka_errors[mid].code == err)
			return &kafka_errors[mid];
		if (kafka_errors[mid].code < err)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const char *km_err_name(km_err err)
{
	const struct kafka_error *k = kafka_lookup(err);
	if (k)
		return k->name;
	for (size_t i = 0; i < N_INTERNAL; i++)
		if (internal_errors[i].code == err)
			return internal_errors[i].name;
	return "UNKNOWN_CODE";
}

const char *km_err_message(km_err err)
{
	const struct kafka_error *k = kafka_lookup(err);
	if (k)
		return k->message;
	for (size_t i = 0; i < N_INTERNAL; i++)
		if (internal_errors[i].code == err)
			return internal_errors[i].message;
	return "unknown error code";
}

bool km_err_retriable(km_err err)
{
	const struct kafka_error *k = kafka_lookup(err);
	if (k)
		return k->retriable;
	return err == KM_ERR_IO || err == KM_ERR_CLOSED || err == KM_ERR_TIMEOUT;
}

bool km_err_is_known(km_err err)
{
	return kafka_lookup(err) != NULL;
}

bool km_err_is_mirror(km_err err)
{
	return err >= KM_MIRROR_ERROR_FIRST && kafka_lookup(err) != NULL;
}

km_err km_err_by_name(const char *name)
{
	for (size_t i = 0; i < N_KAFKA; i++)
		if (strcmp(kafka_errors[i].name, name) == 0)
			return kafka_errors[i].code;
	for (size_t i = 0; i < N_MIRROR; i++)
		if (strcmp(mirror_errors[i].name, name) == 0)
			return mirror_errors[i].code;
	return KM_KAFKA_UNKNOWN_SERVER_ERROR;
}
