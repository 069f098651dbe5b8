/*
 * Micro-benchmark of the record batch codec: iterate + CRC-verify, and restamp producer fields + CRC,
 * over record sets of 1 KiB .. 1 MiB batches (uncompressed and lz4), with the hardware and the table
 * CRC measured in the same run. Prints a Markdown table. Not a test.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kmirror/batch.h"
#include "kmirror/crc32c.h"

#define SET_BYTES (16u << 20) /* each record set: copies of one batch, about 16 MiB */

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Records of 200 bytes of word-like text: lz4 gets a real but modest ratio. */
static void build(km_wr *w, int codec, int nrec)
{
	static char vals[200 * 16384];
	static km_batch_record recs[16384];
	static const char *words[] = {"mirror ", "kafka ", "batch ", "offset ", "record ", "topic ", "lag ", "epoch "};
	uint32_t x = 12345;
	for (int i = 0; i < nrec; i++) {
		char *v = vals + (size_t)i * 200;
		size_t n = 0;
		while (n < 200) {
			x ^= x << 13;
			x ^= x >> 17;
			x ^= x << 5;
			const char *wd = words[x % 8];
			for (size_t k = 0; wd[k] && n < 200; k++)
				v[n++] = (x >> 8) % 5 == 0 ? (char)('a' + (x >> 12) % 26) : wd[k];
		}
		recs[i] = (km_batch_record){.timestamp = 1700000000000 + i, .offset_delta = i,
					    .key = {(const uint8_t *)v, 16}, .value = {(const uint8_t *)v, 200}};
	}
	km_batch_params p;
	km_batch_params_init(&p);
	p.codec = codec;
	p.producer_id = 1;
	p.producer_epoch = 0;
	p.base_sequence = 0;
	km_wr_init(w);
	if (km_batch_build(&p, recs, (size_t)nrec, w) != KM_OK) {
		fprintf(stderr, "build failed\n");
		exit(1);
	}
}

/* The smallest record count whose batch reaches target bytes. */
static int records_for(int codec, size_t target)
{
	int lo = 1, hi = 16384;
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		km_wr w;
		build(&w, codec, mid);
		if (w.len >= target)
			hi = mid;
		else
			lo = mid + 1;
		km_wr_free(&w);
	}
	return lo;
}

static volatile uint64_t sink;

static double run_verify(const uint8_t *set, size_t len)
{
	km_batch_iter it;
	km_batch b;
	uint64_t n = 0;
	double t0 = now();
	km_batch_iter_init(&it, set, len);
	while (km_batch_next(&it, &b)) {
		if (km_batch_verify_crc(b.data, b.size) != KM_OK) {
			fprintf(stderr, "bad crc\n");
			exit(1);
		}
		n += (uint64_t)b.records_count;
	}
	double t = now() - t0;
	sink += n;
	return t;
}

static double run_restamp(uint8_t *set, size_t len, int64_t pid)
{
	km_batch_iter it;
	km_batch b;
	double t0 = now();
	km_batch_iter_init(&it, set, len);
	int32_t seq = 0;
	while (km_batch_next(&it, &b)) {
		uint8_t *mb = set + b.offset;
		km_batch_set_base_offset(mb, 0);
		sink += km_batch_restamp(mb, b.size, pid, 0, seq);
		seq += b.records_count;
	}
	return now() - t0;
}

static double best(double (*f)(uint8_t *, size_t, int64_t), uint8_t *set, size_t len, int runs)
{
	double m = 1e9;
	for (int i = 0; i < runs; i++) {
		double t = f(set, len, 1000 + i);
		if (t < m)
			m = t;
	}
	return m;
}

static double verify_adapter(uint8_t *set, size_t len, int64_t pid)
{
	(void)pid;
	return run_verify(set, len);
}

int main(int argc, char **argv)
{
	int runs = argc > 1 ? atoi(argv[1]) : 7;
	static const size_t sizes[] = {1024, 16 * 1024, 256 * 1024, 1024 * 1024};
	static const int codecs[] = {KM_CODEC_NONE, KM_CODEC_LZ4};
	printf("CRC32C: hardware %s; best of %d runs over ~%u MiB record sets\n\n",
	       km_crc32c_hw_available() ? "sse4.2" : "absent", runs, SET_BYTES >> 20);
	printf("| batch | codec | records | iterate+verify %s MB/s | table MB/s | restamp+CRC %s MB/s | table MB/s |\n",
	       km_crc32c_hw_available() ? "hw" : "(table)", km_crc32c_hw_available() ? "hw" : "(table)");
	printf("| ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		for (size_t c = 0; c < 2; c++) {
			int nrec = records_for(codecs[c], sizes[s]);
			km_wr one;
			build(&one, codecs[c], nrec);
			size_t copies = SET_BYTES / one.len + 1, len = copies * one.len;
			uint8_t *set = malloc(len);
			for (size_t i = 0; i < copies; i++)
				memcpy(set + i * one.len, one.buf, one.len);
			double mb = (double)len / 1e6, r[4];
			km_crc32c_force_table(false);
			r[0] = best(verify_adapter, set, len, runs);
			r[2] = best(run_restamp, set, len, runs);
			km_crc32c_force_table(true);
			r[1] = best(verify_adapter, set, len, runs);
			r[3] = best(run_restamp, set, len, runs);
			km_crc32c_force_table(false);
			printf("| %zu B | %s | %d | %.0f | %.0f | %.0f | %.0f |\n", one.len, km_codec_name(codecs[c]), nrec,
			       mb / r[0], mb / r[1], mb / r[2], mb / r[3]);
			free(set);
			km_wr_free(&one);
		}
	}
	return 0;
}
