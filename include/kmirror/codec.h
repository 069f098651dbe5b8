/* Pieces shared by every generated message codec: unknown tagged fields and decode error text. */
#ifndef KMIRROR_CODEC_H
#define KMIRROR_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "kmirror/wire.h"

/* A tagged field the codec does not know (or not in this version), kept raw so re-encoding loses nothing. */
typedef struct km_tagged {
	uint32_t tag;
	km_bytes data; /* borrowed from the decoded buffer */
} km_tagged;

/* Kept in the order read; encoders write them merged with the known tags, in ascending tag order. */
typedef struct km_tagged_list {
	int32_t count;
	km_tagged *items;
} km_tagged_list;

/*
 * Describes a failed decode: "ApiKey 3 (Metadata) v12: field Topics at byte 37: truncated".
 * Returns what snprintf returns. Safe with any reader state (also KM_OK: "...: no error").
 */
int km_codec_strerror(char *buf, size_t n, int16_t api_key, int16_t version, const km_rd *r);
/* The same for a message without an api key: "RequestHeader v2: field ClientId at byte 8: truncated". */
int km_codec_strerror_msg(char *buf, size_t n, const char *message, int16_t version, const km_rd *r);

#endif
