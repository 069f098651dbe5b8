/* Mirror secrets through the store's own calls: a value opens only in the mirror it was sealed for, a value of format 0 still opens, a key file others may read is refused at start. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include <event2/event.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "kmirror/daemon_config.h"
#include "state/state_int.h"

/* The key of every test, as the key file holds it. */
static const char key_hex[] = "00112233445566778899aabbccddeeff0123456789abcdef0123456789abcdef";
static uint8_t key[32];

/*
 * The sealed formats, written here from docs/state.md rather than with secret.c: format 1 is version
 * byte 1, nonce, ciphertext, tag, and its associated data the version byte, then the mirror's and
 * the key's names each after a two-byte big-endian length; format 0 is nonce, ciphertext, tag, with
 * the key's name alone as associated data.
 */
static size_t seal(int version, const char *mirror, const char *name, const char *clear, uint8_t *out)
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	uint8_t *nonce = version ? out + 1 : out, *ct = nonce + 12, v = 1;
	size_t clen = strlen(clear);
	int l = 0;

	out[0] = 1;
	assert_int_equal(RAND_bytes(nonce, 12), 1);
	assert_int_equal(EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, nonce), 1);
	if (version) {
		const char *part[2] = {mirror, name};
		assert_int_equal(EVP_EncryptUpdate(ctx, NULL, &l, &v, 1), 1);
		for (int i = 0; i < 2; i++) {
			uint8_t be[2] = {(uint8_t)(strlen(part[i]) >> 8), (uint8_t)strlen(part[i])};
			assert_int_equal(EVP_EncryptUpdate(ctx, NULL, &l, be, 2), 1);
			assert_int_equal(EVP_EncryptUpdate(ctx, NULL, &l, (const uint8_t *)part[i], (int)strlen(part[i])), 1);
		}
	} else {
		assert_int_equal(EVP_EncryptUpdate(ctx, NULL, &l, (const uint8_t *)name, (int)strlen(name)), 1);
	}
	assert_int_equal(EVP_EncryptUpdate(ctx, ct, &l, (const uint8_t *)clear, (int)clen), 1);
	assert_int_equal(EVP_EncryptFinal_ex(ctx, ct + l, &l), 1);
	assert_int_equal(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, ct + clen), 1);
	EVP_CIPHER_CTX_free(ctx);
	return (size_t)(ct + clen + 16 - out);
}

static char *key_file(mode_t mode)
{
	char *path = strdup("/tmp/km-unit-key-XXXXXX");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, key_hex, sizeof(key_hex) - 1), (ssize_t)(sizeof(key_hex) - 1));
	close(fd);
	assert_int_equal(chmod(path, mode), 0);
	return path;
}

/* A store on an address nobody answers (the loop never turns), with the key file path and extra options. */
static km_state *store(struct event_base *base, const char *path, const char *opt, const char *val, char *err,
		       size_t errlen)
{
	km_config cfg;
	km_state_opts o;
	km_state *st;

	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "127.0.0.1:1", err, errlen), KM_OK);
	assert_int_equal(km_config_set(&cfg, "mirror_secret_key_file", path, err, errlen), KM_OK);
	if (opt)
		assert_int_equal(km_config_set(&cfg, opt, val, err, errlen), KM_OK);
	memset(&o, 0, sizeof(o));
	o.base = base;
	o.cfg = &cfg;
	st = km_state_new(&o, err, errlen);
	km_config_free(&cfg);
	return st;
}

/* A mirror record of name with a bootstrap server and one sealed sasl.password, applied to m. */
static void mirror_rec(km_state_model *m, const char *name, const uint8_t *sealed, size_t len)
{
	km_state_cfg_entry cfg[2] = {{.name = "bootstrap.servers", .value = "src:9092"},
				     {.name = "sasl.password", .sealed = (uint8_t *)sealed, .sealed_len = len}};
	km_state_mirror mi = {.name = (char *)name, .created_ms = 1, .modified_ms = 2, .cfg = cfg, .ncfg = 2};
	km_state_key k = {.type = KM_STATE_REC_MIRROR, .mirror = km_str_c(name)};
	km_state_change chg;
	km_wr kw, vw;

	km_wr_init(&kw);
	km_wr_init(&vw);
	km_state_key_encode(&kw, &k);
	assert_int_equal(km_state_mirror_value_encode(&vw, &mi), KM_OK);
	assert_int_equal(km_state_model_apply(m, kw.buf, kw.len, vw.buf, vw.len, false, &chg), KM_OK);
	km_wr_free(&kw);
	km_wr_free(&vw);
}

/* What km_state_mirror_secret answers for mirror's sasl.password, with the log lines it wrote (stderr). */
static km_err secret_of(km_state *st, const char *mirror, char *buf, size_t len, char *log, size_t loglen)
{
	const km_state_mirror *m = km_state_mirror_find(st, mirror);
	FILE *tmp = tmpfile();
	int saved = dup(2);
	km_err rc;
	size_t n;

	assert_non_null(m);
	assert_non_null(tmp);
	fflush(stderr);
	dup2(fileno(tmp), 2);
	rc = km_state_mirror_secret(st, m, "sasl.password", buf, len);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(tmp);
	n = fread(log, 1, loglen - 1, tmp);
	log[n] = 0;
	fclose(tmp);
	return rc;
}

/*
 * Mirror alpha's password, sealed for alpha, copied into bravo's record: bravo's does not open, and
 * the log names bravo and the key. A value of format 0 (charlie's) still opens.
 */
static void test_moved_value_refused(void **state)
{
	struct event_base *base = event_base_new();
	char *path = key_file(0600), err[512], buf[256], log[4096];
	uint8_t alpha[128], old[128];
	size_t alen, olen;
	km_state_model m;
	km_state *st;
	(void)state;

	alen = seal(1, "alpha", "sasl.password", "pw-of-alpha", alpha);
	olen = seal(0, NULL, "sasl.password", "pw-of-charlie", old);
	st = store(base, path, NULL, NULL, err, sizeof(err));
	assert_non_null(st);
	km_state_model_init(&m);
	mirror_rec(&m, "alpha", alpha, alen);
	mirror_rec(&m, "bravo", alpha, alen);
	mirror_rec(&m, "charlie", old, olen);
	assert_int_equal(km_state_model_index(&m), KM_OK);
	km_state_loaded(st, &m);

	assert_int_equal(secret_of(st, "alpha", buf, sizeof(buf), log, sizeof(log)), KM_OK);
	assert_string_equal(buf, "pw-of-alpha");
	assert_int_equal(secret_of(st, "bravo", buf, sizeof(buf), log, sizeof(log)), KM_ERR_DECODE);
	assert_null(strstr(buf, "pw-of-alpha"));
	assert_non_null(strstr(log, "level=error"));
	assert_non_null(strstr(log, "mirror 'bravo': sasl.password does not open"));
	assert_null(strstr(log, "pw-of-alpha"));
	assert_int_equal(secret_of(st, "charlie", buf, sizeof(buf), log, sizeof(log)), KM_OK);
	assert_string_equal(buf, "pw-of-charlie");
	assert_string_equal(log, "");

	km_state_free(st);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
	unlink(path);
	free(path);
}

/* A key file group or others may read: the store does not start, and says what to run; the option allows it. */
static void test_key_file_mode_refused(void **state)
{
	struct event_base *base = event_base_new();
	char *path = key_file(0644), err[512], want[300];
	km_state *st;
	(void)state;

	err[0] = 0;
	st = store(base, path, NULL, NULL, err, sizeof(err));
	assert_null(st);
	snprintf(want, sizeof(want), "run chmod 600 %s", path);
	assert_non_null(strstr(err, "mirror_secret_key_file"));
	assert_non_null(strstr(err, want));

	st = store(base, path, "secret_file_mode_check", "false", err, sizeof(err));
	assert_non_null(st);
	km_state_free(st);

	assert_int_equal(chmod(path, 0600), 0);
	st = store(base, path, NULL, NULL, err, sizeof(err));
	assert_non_null(st);
	km_state_free(st);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
	unlink(path);
	free(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_moved_value_refused),
		cmocka_unit_test(test_key_file_mode_refused),
	};
	for (size_t i = 0; i < sizeof(key); i++)
		sscanf(key_hex + 2 * i, "%2hhx", &key[i]);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
