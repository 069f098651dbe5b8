/*
 * libFuzzer harness: kmirrord's config file parser (km_config_load_file over the option table of
 * src/core/daemon_config.c and the engine of src/core/options.c), the cross-option checks, and
 * --print-config's output (km_opt_write_values), which must load back to the same configuration
 * (secrets aside: they are printed masked).
 *
 * Input: the file.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kmirror/daemon_config.h"
#include "kmirror/log.h"
#include "kmirror/options.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char in_path[64], out_path[64];

static void die(const char *what, const char *detail)
{
	fprintf(stderr, "fuzz_config: %s: %s\n", what, detail);
	abort();
}

static void write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0)
		die("cannot write", path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const km_opt_table *t = km_config_table();
	km_config cfg, back;
	char err[1024];
	bool valid;
	FILE *f;

	if (!in_path[0]) {
		const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
		km_log_set_level(KM_LOG_ERROR);
		snprintf(in_path, sizeof(in_path), "%s/kmirror-fuzz-config-%d", dir, (int)getpid());
		snprintf(out_path, sizeof(out_path), "%s/kmirror-fuzz-config-%d.out", dir, (int)getpid());
	}
	if (size > 65536)
		return 0;
	write_file(in_path, data, size);
	km_config_init(&cfg);
	if (km_config_load_file(&cfg, in_path, err, sizeof(err)) != KM_OK) {
		km_config_free(&cfg);
		unlink(in_path);
		return 0;
	}
	unlink(in_path);
	valid = km_config_validate(&cfg, err, sizeof(err)) == KM_OK;
	/* --print-config: a file that loads back. */
	if (!(f = fopen(out_path, "w")))
		die("cannot write", out_path);
	km_opt_write_values(t, &cfg, f);
	if (fclose(f) != 0)
		die("cannot write", out_path);
	km_config_init(&back);
	if (km_config_load_file(&back, out_path, err, sizeof(err)) != KM_OK)
		die("--print-config's output does not load", err);
	for (size_t i = 0; i < t->count; i++) {
		char a[16384], b[16384];
		if (t->rows[i].secret || km_opt_equal(&t->rows[i], &cfg, &back))
			continue;
		km_opt_format(&t->rows[i], &cfg, a, sizeof(a));
		km_opt_format(&t->rows[i], &back, b, sizeof(b));
		fprintf(stderr, "%s: '%s' became '%s'\n", t->rows[i].name, a, b);
		die("--print-config's output loads another value", t->rows[i].name);
	}
	/* The same configuration again is a valid reload (only secrets, masked, may differ). */
	if (valid && km_config_check_reload(&cfg, &back, err, sizeof(err)) != KM_OK && !strstr(err, "password"))
		die("the configuration printed and loaded back is no valid reload", err);
	km_config_free(&cfg);
	km_config_free(&back);
	unlink(out_path);
	return 0;
}
