/* The API dispatch table: one row per Kafka API key, generated from the message definitions. */
#ifndef KMIRROR_API_H
#define KMIRROR_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmirror/arena.h"
#include "kmirror/error.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/wire.h"

/* Which listeners an API is served on (the JSON "listeners"). */
enum {
	KM_API_LISTENER_BROKER = 1 << 0,
	KM_API_LISTENER_CONTROLLER = 1 << 1,
	KM_API_LISTENER_ZK_BROKER = 1 << 2,
	KM_API_LISTENER_KMIRROR = 1 << 3, /* kmirror's own RPCs (src/codec/messages): kmirrord answers them */
};

/* A message's codec behind void pointers, for code that handles any API key (fuzzers, loggers). */
typedef struct km_api_codec {
	const char *name;   /* "MetadataRequest" */
	size_t struct_size; /* sizeof the message struct, for callers that allocate one */
	void (*init)(void *m);
	km_err (*decode)(km_rd *r, int16_t version, void *m, km_arena *a);
	void (*encode)(km_wr *w, int16_t version, const void *m);
	size_t (*size)(int16_t version, const void *m);
} km_api_codec;

typedef struct km_api_info {
	int16_t api_key;
	const char *name;       /* "Metadata" */
	int16_t min_version;    /* the versions the codec supports (validVersions) */
	int16_t max_version;
	int16_t first_flexible; /* -1 if no version is flexible */
	bool latest_unstable;   /* max_version is not yet a stable release version */
	int16_t deprecated_min; /* deprecated versions, -1 if none */
	int16_t deprecated_max;
	unsigned listeners;     /* KM_API_LISTENER_* */
	int16_t request_header_v0_max; /* versions <= this use request header v0 (-1: none) */
	bool response_header_always_v0;
	km_api_codec request;
	km_api_codec response;
} km_api_info;

/* Every row, sorted by api key (generated). */
const km_api_info *km_api_table(size_t *count);
/* The row for api_key, or NULL if unknown. */
const km_api_info *km_api_lookup(int16_t api_key);
/* Whether the codec supports version of api_key. */
bool km_api_version_supported(int16_t api_key, int16_t version);
/* Whether version of the API uses the flexible (compact, tagged) encoding. */
bool km_api_is_flexible(const km_api_info *api, int16_t version);
/* Request header version (0, 1 or 2) for a request of key/version; -1 if unknown or unsupported. */
int km_api_request_header_version(int16_t key, int16_t version);
/* Response header version (0 or 1); ApiVersions always answers with v0. -1 if unknown or unsupported. */
int km_api_response_header_version(int16_t key, int16_t version);

#endif
