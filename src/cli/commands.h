/* The kmirror CLI's commands, internal: a command's context and the helpers every command file uses. */
#ifndef KMIRROR_CLI_COMMANDS_H
#define KMIRROR_CLI_COMMANDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli/cli.h"
#include "kmirror/arena.h"
#include "kmirror/clock.h"
#include "kmirror/msg/describe_mirrors_response.h"
#include "kmirror/wire.h"

#define ARENA_CAP ((size_t)256 << 20) /* a describe of many mirrors with many partitions */
#define SECRET_SHOWN "(secret)"
#define MIRROR_STATE_TOPIC "__mirror_state"
#define RETRY_BACKOFF_MS 200 /* between retries of a request kmirrord could not serve yet */

typedef struct ctx {
	const km_cli_args *a;
	FILE *out, *err;
	km_cli_conn *cc;
	km_arena arena;
	uint8_t *resp; /* the last response body; decoded strings borrow it */
	size_t resp_len;
	const char *cmd;
} ctx;


/* ---- commands.c: calling kmirrord, its errors, the commands' connection ---- */

void km_cmd_say_err(ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A refusal's message: its own text, else the error's name. */
void km_cmd_message_of(int16_t code, km_str msg, char *buf, size_t len);
/* {"code", "name", "message"} of an error, or null for none. */
void km_cmd_json_error(km_cli_json *j, int16_t code, km_str msg);
/* A request's top-level error said (stderr, or the JSON on stdout); the exit code. */
int km_cmd_top_error(ctx *x, int16_t code, km_str msg);
/* Send w (freed) as api_key at version and read the response body into r; false: said why. */
bool km_cmd_call(ctx *x, int16_t api_key, km_wr *w, int16_t version, km_rd *r);
/*
 * api_key at version: req (the request struct) encoded through the API table, sent, and the answer
 * decoded into resp (the response struct, in the command's arena); false: said why.
 */
bool km_cmd_rpc(ctx *x, int16_t api_key, int16_t version, const void *req, void *resp);
/* Whether a response decoded (rc); false: said where it failed. */
bool km_cmd_decoded(ctx *x, km_err rc, int16_t api_key, int16_t version, const km_rd *r);
/*
 * Every topic of the cluster at the other end of x's connection (Metadata of all), internal topics
 * and kmirror's state topic left out (never mirror targets), the names copied into the command's
 * arena (they outlive the answer). False with why when the cluster does not answer Metadata v1+
 * (why stays empty when the call failed: that is said already).
 */
bool km_cmd_topic_names(ctx *x, km_str **names, size_t *n, char *why, size_t whylen);
/* The version of api_key kmirrord serves; -1: said it does not. */
int16_t km_cmd_version_of(ctx *x, int16_t api_key);
/* A connection to bootstrap with the command's properties; NULL: said why, *rc the exit code. */
km_cli_conn *km_cmd_open_conn(const km_cli_args *a, const char *bootstrap, FILE *errf, int *rc);
/*
 * The same to any Kafka cluster (kmirrord false: no mirror RPCs asked for) within timeout_ms: a
 * failure to connect is left in err for the caller to word (*rc KM_CLI_EXIT_ERROR); a bad
 * --command-config is said on errf (*rc KM_CLI_EXIT_USAGE).
 */
km_cli_conn *km_cmd_connect(const km_cli_args *a, const char *bootstrap, bool kmirrord, int64_t timeout_ms, FILE *errf,
			    char *err, size_t errlen, int *rc);

/* ---- source.c: the mirror's source, asked by the dry runs ---- */

typedef struct km_cmd_src_part {
	const char *topic;
	int32_t partition;
	int32_t leader;      /* filled: the source's leader, -1 none */
	int64_t end, lso;    /* filled: the end offset and the last stable offset now, -1 not known */
} km_cmd_src_part;

/*
 * The end offsets and last stable offsets of parts, asked of their leaders on the source
 * (bootstrap source, --command-config's settings, 5 s at most). True when every part has its end;
 * false with why (the source unreachable, a partition without a leader) and what was learned.
 */
bool km_cmd_source_ends(ctx *x, const char *source, km_cmd_src_part *parts, size_t n, char *why, size_t whylen);
/*
 * The source's topics (Metadata of all, internal ones left out), copied into the command's arena:
 * *names, *n. False with why when the source cannot be reached (--command-config's settings, 5 s).
 */
bool km_cmd_source_topics(ctx *x, const char *source, km_str **names, size_t *n, char *why, size_t whylen);

/* ---- cmd_describe.c ---- */

bool km_cmd_describe_call(ctx *x, const char *mirror, char *const *topics, size_t ntopics,
			  km_describe_mirrors_response *resp);
/* v as a number, "-" when negative (not known). */
void km_cmd_num_or_dash(int64_t v, char *buf, size_t len);
int km_cmd_describe(ctx *x);

/* ---- cmd_topics.c: start, stop, promote, pause, resume ---- */

/* Whole-name matches of re among names (arena strings in *out). */
bool km_cmd_regex_select(ctx *x, const char *re, km_str *names, size_t n, char ***out, size_t *nout);
/* DescribeMirrors of the command's mirror: the one mirror in *dm. */
int km_cmd_describe_one(ctx *x, char *const *topics, size_t ntopics, km_describe_mirrors_response *resp,
			const km_describe_mirrors_response_described_mirror **dm);
/* The mirror's topics. */
int km_cmd_mirror_topics(ctx *x, km_str **names, size_t *n);
int km_cmd_topics(ctx *x);

/* ---- cmd_failback.c ---- */

int km_cmd_last_offsets(ctx *x);
int km_cmd_reverse(ctx *x);

#endif
