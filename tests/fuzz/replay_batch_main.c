/* Replays a fuzz target over the files of its corpus directory (make check), without libFuzzer. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		return -1;
	}
	struct stat st;
	if (fstat(fileno(f), &st) != 0 || st.st_size < 0) {
		fclose(f);
		return -1;
	}
	size_t n = (size_t)st.st_size;
	uint8_t *buf = malloc(n ? n : 1);
	if (!buf || fread(buf, 1, n, f) != n) {
		fprintf(stderr, "%s: read failed\n", path);
		free(buf);
		fclose(f);
		return -1;
	}
	fclose(f);
	/* An exact-size copy, so that ASan sees reads past the end. */
	LLVMFuzzerTestOneInput(buf, n);
	free(buf);
	return 0;
}

static int replay_path(const char *path, long *count)
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
	if (!d)
		return -1;
	struct dirent *e;
	int rc = 0;
	while ((e = readdir(d)) && rc == 0) {
		if (e->d_name[0] == '.')
			continue;
		char p[4096];
		snprintf(p, sizeof(p), "%s/%s", path, e->d_name);
		rc = replay_path(p, count);
	}
	closedir(d);
	return rc;
}

int main(int argc, char **argv)
{
	long count = 0;
	int rc = 0;
#ifdef FUZZ_CORPUS
	if (argc < 2)
		rc = replay_path(FUZZ_CORPUS, &count);
#endif
	for (int i = 1; i < argc && rc == 0; i++)
		rc = replay_path(argv[i], &count);
	printf("%s: replayed %ld inputs\n", argv[0], count);
	/* An empty corpus proves nothing: fail. */
	return rc != 0 || count == 0;
}
