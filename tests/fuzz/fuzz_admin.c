/*
 * libFuzzer harness: the body of POST /admin/upstream (the new bootstrap list of an upstream swap)
 * as the HTTP handler reads it (km_proxy_admin_body, from an evbuffer of random chains) and as
 * km_proxy_swap parses it (the upstream option's HOST:PORT list); then what a swap persists: the
 * list formatted, written to an upstream_file and read back at the next start must be the same list.
 *
 * Input: 3 bytes seeding the piece sizes (fuzz_split.h), then the body.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_split.h"
#include "kmirror/daemon_config.h"
#include "kmirror/options.h"
#include "proxy/proxy_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];

static void die(const char *what, const char *detail)
{
	fprintf(stderr, "fuzz_admin: %s: %s\n", what, detail);
	abort();
}

static bool same_list(const km_config *a, const km_config *b)
{
	if (a->upstream_count != b->upstream_count)
		return false;
	for (int i = 0; i < a->upstream_count; i++)
		if (a->upstream[i].port != b->upstream[i].port || strcmp(a->upstream[i].host, b->upstream[i].host) != 0)
			return false;
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char text[2048], why[1024], formatted[16384], err[1024];
	struct evbuffer *body;
	km_config cfg, again, started;
	km_fuzz_rng g;

	if (!path[0]) {
		/* A swap fsyncs its file: on tmpfs when there is one, so fuzzing is not disk-bound. */
		snprintf(path, sizeof(path), "%s/kmirror-fuzz-upstream-%d", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
			 (int)getpid());
	}
	if (size < 3 || size > 8192)
		return 0;
	km_fuzz_rng_init(&g, data);
	body = evbuffer_new();
	km_fuzz_add_split(body, &g, data + 3, size - 3);
	if (!km_proxy_admin_body(body, text, sizeof(text), why, sizeof(why))) {
		evbuffer_free(body);
		return 0;
	}
	evbuffer_free(body);
	if (strlen(text) >= sizeof(text))
		die("the body's text is not terminated", "");

	/* What km_proxy_swap does with it. */
	km_config_init(&cfg);
	if (km_config_set(&cfg, "upstream", text, err, sizeof(err)) != KM_OK || cfg.upstream_count == 0) {
		km_config_free(&cfg);
		return 0;
	}
	/* Formatted (as logged, answered and persisted), it parses back to the same list. */
	km_config_format_upstream(cfg.upstream, cfg.upstream_count, formatted, sizeof(formatted));
	km_config_init(&again);
	if (km_config_set(&again, "upstream", formatted, err, sizeof(err)) != KM_OK || !same_list(&cfg, &again))
		die("the formatted list does not parse back to the same list", formatted);
	/* Persisted, then read back at the next start: the same list. */
	if (km_config_write_upstream_file(path, cfg.upstream, cfg.upstream_count, err, sizeof(err)) != KM_OK)
		die("cannot write the upstream file", err);
	km_config_init(&started);
	if (km_config_set(&started, "upstream_file", path, err, sizeof(err)) != KM_OK)
		die("upstream_file", err);
	if (km_config_apply_upstream_file(&started, err, sizeof(err)) != KM_OK)
		die("a swap's upstream_file does not load at the next start", err);
	if (!same_list(&cfg, &started))
		die("a swap's upstream_file loads another list", formatted);
	unlink(path);
	km_config_free(&cfg);
	km_config_free(&again);
	km_config_free(&started);
	return 0;
}
