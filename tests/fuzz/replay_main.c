/*
 * Replays fuzz inputs through a harness without libFuzzer, so make check runs every committed corpus
 * entry (and crash regression) under the normal and sanitizer builds. Arguments: files or directories;
 * none means the corpus compiled in as KM_FUZZ_CORPUS.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef KM_FUZZ_NAME
#define KM_FUZZ_NAME "fuzz"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		return -1;
	}
	size_t cap = 4096, len = 0;
	uint8_t *buf = malloc(cap);
	size_t n;
	while (buf && (n = fread(buf + len, 1, cap - len, f)) > 0) {
		len += n;
		if (len == cap) {
			uint8_t *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		}
	}
	fclose(f);
	if (!buf) {
		fprintf(stderr, "%s: out of memory\n", path);
		return -1;
	}
	/* An exact-size copy, so sanitizers see reads past the end of the input. */
	uint8_t *exact = malloc(len ? len : 1);
	memcpy(exact, buf, len);
	free(buf);
	LLVMFuzzerTestOneInput(exact, len);
	free(exact);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int replay_path(const char *path, size_t *count)
{
	struct stat st;
	if (stat(path, &st) != 0) {
		perror(path);
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		(*count)++;
		return replay_file(path);
	}
	DIR *d = opendir(path);
	if (!d) {
		perror(path);
		return -1;
	}
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			names = realloc(names, cap * sizeof(*names));
		}
		names[n++] = strdup(e->d_name);
	}
	closedir(d);
	if (n)
		qsort(names, n, sizeof(*names), cmp_str);
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(path) + strlen(names[i]) + 2;
		char *p = malloc(len);
		snprintf(p, len, "%s/%s", path, names[i]);
		if (replay_path(p, count) != 0)
			rc = -1;
		free(p);
		free(names[i]);
	}
	free(names);
	return rc;
}

int main(int argc, char **argv)
{
	size_t count = 0;
	int rc = 0;
	if (argc > 1) {
		for (int i = 1; i < argc; i++)
			if (replay_path(argv[i], &count) != 0)
				rc = 1;
	} else {
#ifdef KM_FUZZ_CORPUS
		if (replay_path(KM_FUZZ_CORPUS, &count) != 0)
			rc = 1;
#else
		fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
		return 2;
#endif
	}
	printf("replay %s: %zu inputs, %s\n", KM_FUZZ_NAME, count, rc ? "errors" : "ok");
	if (count == 0) {
		fprintf(stderr, "replay %s: empty corpus\n", KM_FUZZ_NAME);
		return 1;
	}
	return rc;
}
