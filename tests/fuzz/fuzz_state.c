/*
 * libFuzzer harness: records of __mirror_state applied to a model (src/state/model.c) as a commit
 * applies them (in the order given) and as a load does (mirrors, then partitions, then runs), the
 * model handed to a real store (made without connecting: its event loop never runs, as in
 * test_state), and everything the proxy and the mirror read from it: topics by name and id,
 * read-only verdicts, offset maps and their translations, configuration entries, secrets opened
 * with a fixed key, mirror options and their filters, configuration checks.
 *
 * Input: records, each a 2-byte key length, the key, a 2-byte value length (0xffff: a tombstone),
 * the value.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "kmirror/daemon_config.h"
#include "kmirror/log.h"
#include "kmirror/options.h"
#include "kmirror/state.h"
#include "kmirror/wire.h"
#include "proxy/offsets.h"
#include "proxy/readonly.h"
#include "state/state_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_RECORDS 512

static struct event_base *base;
static km_state *store;

static void die(const char *what)
{
	fprintf(stderr, "fuzz_state: %s\n", what);
	abort();
}

/* The store, once: a secret key of 32 bytes 0x42 (make_seeds seals with the same), nothing listening upstream. */
static void setup(void)
{
	char path[] = "/tmp/kmirror-fuzz-state-key-XXXXXX", err[256];
	uint8_t key[KM_STATE_KEY_BYTES];
	km_state_opts o;
	km_config cfg;
	int fd = mkstemp(path);

	km_log_set_level(KM_LOG_ERROR);
	memset(key, 0x42, sizeof(key));
	if (fd < 0 || write(fd, key, sizeof(key)) != (ssize_t)sizeof(key))
		die("cannot write the key file");
	close(fd);
	base = event_base_new();
	km_config_init(&cfg);
	if (km_config_set(&cfg, "upstream", "127.0.0.1:1", err, sizeof(err)) != KM_OK ||
	    km_config_set(&cfg, "mirror_secret_key_file", path, err, sizeof(err)) != KM_OK)
		die(err);
	memset(&o, 0, sizeof(o));
	o.base = base;
	o.cfg = &cfg;
	if (!(store = km_state_new(&o, err, sizeof(err))))
		die(err);
	km_config_free(&cfg);
	unlink(path);
}

typedef struct rec {
	const uint8_t *key, *val;
	size_t klen, vlen;
	bool tomb;
} rec;

static size_t parse(const uint8_t *p, size_t n, rec *out)
{
	size_t k = 0, at = 0;
	while (k < MAX_RECORDS && at + 4 <= n) {
		size_t kl = km_be16(p + at), vl;
		if (at + 2 + kl + 2 > n)
			break;
		out[k].key = p + at + 2;
		out[k].klen = kl;
		at += 2 + kl;
		vl = km_be16(p + at);
		at += 2;
		out[k].tomb = vl == 0xffff;
		if (out[k].tomb)
			vl = 0;
		if (at + vl > n)
			vl = n - at;
		out[k].val = out[k].tomb ? NULL : p + at;
		out[k].vlen = vl;
		at += vl;
		k++;
	}
	return k;
}

/* A map as the store keeps it: runs sorted by logical start, none twice; and its translations. */
static void check_map(const km_offmap *m)
{
	static const int64_t probes[] = {-1, 0, 1, 99, 100, 1000, INT64_MAX - 1, INT64_MAX};
	for (size_t i = 1; i < m->n; i++)
		if (m->runs[i - 1].logical >= m->runs[i].logical)
			die("a map's runs are not sorted by logical start");
	for (size_t i = 0; i < m->n; i++) {
		int64_t l;
		if (m->runs[i].logical < 0 || m->runs[i].physical < 0)
			die("a map holds a negative run");
		(void)km_offmap_run_length(m, i);
		(void)km_offmap_to_logical(m, m->runs[i].physical);
		(void)km_offmap_to_physical(m, m->runs[i].logical);
		(void)km_off_batch_run(m, m->runs[i].physical, &l);
	}
	for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
		int64_t l;
		(void)km_offmap_to_physical(m, probes[i]);
		(void)km_offmap_to_logical(m, probes[i]);
		(void)km_offmap_next_to_logical(m, probes[i]);
		(void)km_offmap_find_logical(m, probes[i]);
		(void)km_off_batch_run(m, probes[i], &l);
	}
}

/* The mirror's options and their filters, and its configuration checked as a create and an alter would. */
static void check_mirror(const km_state_mirror *mi)
{
	size_t n = km_state_mirror_config_count(mi), nkv = 0;
	km_state_kv *kv = calloc(n + 1, sizeof(*kv));
	km_mirror_options mo;
	char err[512], buf[1024];

	(void)km_state_mirror_name(mi);
	(void)km_state_mirror_source(mi);
	for (size_t i = 0; i < n; i++) {
		const char *name, *value;
		bool secret;
		km_state_mirror_config_at(mi, i, &name, &value, &secret);
		if (!name)
			die("a configuration entry without a name");
		if (secret && value)
			die("a secret's value is shown");
		if (secret && km_state_mirror_secret(store, mi, name, buf, sizeof(buf)) == KM_OK && strlen(buf) >= sizeof(buf))
			die("a secret opened past its buffer");
		kv[nkv++] = (km_state_kv){name, value};
	}
	(void)km_state_config_check(kv, nkv, true, err, sizeof(err));
	(void)km_state_config_check(kv, nkv, false, err, sizeof(err));
	free(kv);
	if (km_state_mirror_options(mi, &mo) == KM_OK) {
		km_name_filter *f = km_name_filter_parse(mo.groups_include, mo.groups_exclude, err, sizeof(err));
		km_acl_scope *s = km_acl_scope_parse(mo.acl_include, err, sizeof(err));
		if (f) {
			(void)km_name_filter_match(f, "orders-group");
			km_name_filter_free(f);
		}
		if (s) {
			(void)km_acl_scope_match(s, 2, "orders", 3, 3, "User:alice");
			km_acl_scope_free(s);
		}
		km_opt_free(km_state_mirror_option_table(), &mo);
	}
}

/* Everything a reader asks of the store. */
static void check_store(void)
{
	static const km_uuid zero;
	km_ro_lookup ro;
	km_off_lookup off;

	km_ro_lookup_from_state(store, &ro);
	km_off_lookup_from_state(store, &off);
	(void)km_state_read_only_topics(store);
	if (km_state_topic_find_id(store, &zero))
		die("a topic is found by the zero id");
	for (size_t i = 0; i < km_state_mirror_count(store); i++) {
		const km_state_mirror *mi = km_state_mirror_at(store, i);
		check_mirror(mi);
		if (km_state_mirror_find(store, km_state_mirror_name(mi)) != mi)
			die("a mirror is not found by its name");
		for (size_t j = 0; j < km_state_mirror_topic_count(mi); j++) {
			const km_state_topic *t = km_state_mirror_topic_at(mi, j), *f;
			const char *name = km_state_topic_name(t);
			const void *ot;
			km_ro_verdict vd;
			f = km_state_topic_find(store, name, strlen(name));
			if (!f || strcmp(km_state_topic_name(f), name) != 0)
				die("a topic is not found by its name");
			/* By its id, unless it has none: the zero id is what a request naming topics by name carries. */
			f = km_state_topic_find_id(store, km_state_topic_id(t));
			if (!km_uuid_is_zero(km_state_topic_id(t)) &&
			    (!f || !km_uuid_eq(km_state_topic_id(f), km_state_topic_id(t))))
				die("a topic is not found by its id");
			(void)km_state_topic_state(t);
			ot = off.topic(off.arg, km_str_c(name), NULL);
			for (size_t k = 0; k < km_state_topic_partition_count(t); k++) {
				km_state_partition_info pi;
				const km_offmap *m;
				km_state_topic_partition(t, k, &pi);
				(void)km_state_topic_read_only(t, pi.partition);
				memset(&vd, 0, sizeof(vd));
				ro.check(ro.arg, km_str_c(name), NULL, pi.partition, KM_RO_WRITE, &vd);
				if ((m = km_state_topic_offmap(t, pi.partition)))
					check_map(m);
				if (ot)
					(void)off.map(off.arg, ot, pi.partition);
			}
			(void)km_state_topic_read_only(t, (int32_t)km_state_topic_partition_count(t) + 1);
			memset(&vd, 0, sizeof(vd));
			ro.check(ro.arg, km_str_c(name), NULL, -1, KM_RO_DELETE_TOPIC, &vd);
		}
	}
}

/* The records into a model, in the order given (a commit) or as a load reads them (mirrors, partitions, runs). */
static bool build(km_state_model *m, const rec *r, size_t n, bool load_order)
{
	km_state_model_init(m);
	for (int pass = 0; pass < (load_order ? 3 : 1); pass++)
		for (size_t i = 0; i < n; i++) {
			km_state_change chg;
			int16_t type = r[i].klen >= 2 ? (int16_t)km_be16(r[i].key) : -1;
			int want = type == KM_STATE_REC_MIRROR ? 0 : type == KM_STATE_REC_RUN ? 2 : 1;
			if (load_order && want != pass)
				continue;
			if (km_state_model_apply(m, r[i].key, r[i].klen, r[i].val, r[i].vlen, r[i].tomb, &chg) == KM_OK &&
			    chg.changed && (!chg.mirror || !chg.topic))
				die("a change without its names");
		}
	if (km_state_model_index(m) != KM_OK) {
		km_state_model_free(m);
		return false;
	}
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static rec recs[MAX_RECORDS];
	km_state_model m;
	size_t n;

	if (!store)
		setup();
	if (size > (1u << 20))
		return 0;
	n = parse(data, size, recs);
	/*
	 * The store takes each model in turn, as after a start-up read and two rereads: an empty one
	 * first (every input starts from the same store), then the records as committed, then as loaded
	 * (what lives in memory only is carried from one model to the next).
	 */
	km_state_model_init(&m);
	km_state_loaded(store, &m);
	for (int order = 0; order < 2; order++) {
		if (!build(&m, recs, n, order == 1))
			return 0;
		km_state_loaded(store, &m);
		check_store();
	}
	return 0;
}
