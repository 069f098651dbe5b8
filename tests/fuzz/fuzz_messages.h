/* Shared body of the request and response harnesses: decode any message, re-encode, decode again. */
#ifndef KMIRROR_FUZZ_MESSAGES_H
#define KMIRROR_FUZZ_MESSAGES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/arena.h"
#include "kmirror/codec.h"
#include "kmirror/msg/request_header.h"
#include "kmirror/msg/response_header.h"
#include "kmirror/wire.h"

/* Input: 2-byte api key (0xffff = the request/response header itself), 2-byte version, message body. */

static void km_fuzz_rqh_init(void *m) { km_request_header_init(m); }
static km_err km_fuzz_rqh_decode(km_rd *r, int16_t v, void *m, km_arena *a) { return km_request_header_decode(r, v, m, a); }
static void km_fuzz_rqh_encode(km_wr *w, int16_t v, const void *m) { km_request_header_encode(w, v, m); }
static size_t km_fuzz_rqh_size(int16_t v, const void *m) { return km_request_header_size(v, m); }
static void km_fuzz_rsh_init(void *m) { km_response_header_init(m); }
static km_err km_fuzz_rsh_decode(km_rd *r, int16_t v, void *m, km_arena *a) { return km_response_header_decode(r, v, m, a); }
static void km_fuzz_rsh_encode(km_wr *w, int16_t v, const void *m) { km_response_header_encode(w, v, m); }
static size_t km_fuzz_rsh_size(int16_t v, const void *m) { return km_response_header_size(v, m); }

static void km_fuzz_die(const char *what, const char *name, int16_t v)
{
	fprintf(stderr, "fuzz: %s v%d: %s\n", name, v, what);
	abort();
}

static int km_fuzz_messages(const uint8_t *data, size_t size, int response)
{
	static const km_api_codec rqh = {"RequestHeader", sizeof(km_request_header), km_fuzz_rqh_init,
					 km_fuzz_rqh_decode, km_fuzz_rqh_encode, km_fuzz_rqh_size};
	static const km_api_codec rsh = {"ResponseHeader", sizeof(km_response_header), km_fuzz_rsh_init,
					 km_fuzz_rsh_decode, km_fuzz_rsh_encode, km_fuzz_rsh_size};
	const km_api_codec *c;
	km_arena a;
	km_rd r;
	km_wr w1, w2;
	char msg[256];

	if (size < 4)
		return 0;
	uint16_t key = km_be16(data);
	int16_t v = (int16_t)km_be16(data + 2);
	if (key == 0xffff) {
		c = response ? &rsh : &rqh;
	} else {
		const km_api_info *api = km_api_lookup((int16_t)key);
		if (!api)
			return 0;
		c = response ? &api->response : &api->request;
	}

	void *m1 = malloc(c->struct_size), *m2 = malloc(c->struct_size);
	km_arena_init(&a, 16 << 20);
	km_rd_init(&r, data + 4, size - 4);
	km_err err = c->decode(&r, v, m1, &a);
	if (err != KM_OK) {
		/* A clean failure names a field and stays inside the input. */
		if (!r.err_field || !r.err_what || r.err_pos > size - 4)
			km_fuzz_die("decode failure without a field or offset", c->name, v);
		if (key != 0xffff)
			km_codec_strerror(msg, sizeof(msg), (int16_t)key, v, &r);
		goto out;
	}

	size_t sz = c->size(v, m1);
	km_wr_init(&w1);
	c->encode(&w1, v, m1);
	if (!km_wr_ok(&w1))
		km_fuzz_die("a decoded message does not encode", c->name, v);
	if (w1.len != sz)
		km_fuzz_die("size differs from the encoded length", c->name, v);
	km_rd_init(&r, w1.buf, w1.len);
	if (c->decode(&r, v, m2, &a) != KM_OK || r.pos != w1.len)
		km_fuzz_die("re-encoded message does not decode", c->name, v);
	km_wr_init(&w2);
	c->encode(&w2, v, m2);
	if (!km_wr_ok(&w2) || w2.len != w1.len || (w1.len && memcmp(w1.buf, w2.buf, w1.len) != 0))
		km_fuzz_die("second encoding differs from the first", c->name, v);
	km_wr_free(&w1);
	km_wr_free(&w2);
out:
	km_arena_free(&a);
	free(m1);
	free(m2);
	return 0;
}

#endif
