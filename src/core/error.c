/* Error names, messages and the retriable classification (Kafka's table from errors.tsv). */
#include <stddef.h>

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

static const struct kafka_error *kafka_lookup(km_err err)
{
	size_t lo = 0, hi = N_KAFKA;
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
