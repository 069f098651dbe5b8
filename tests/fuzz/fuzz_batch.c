/* Fuzz target: record set iteration, CRC, patching, records, headers, control records and gap splitting. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/batch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SCRATCH (256 * 1024)
static uint8_t scratch[SCRATCH];

static void check_records(const km_batch *b)
{
	km_record_iter it;
	km_record rec;
	if (km_batch_records(b, scratch, SCRATCH, &it) != KM_OK)
		return;
	int32_t n = 0;
	while (km_record_next(&it, &rec)) {
		km_record_header_iter hi;
		km_record_header h;
		int32_t k = 0;
		km_record_header_iter_init(&hi, &rec);
		while (km_record_header_next(&hi, &h))
			k++;
		/* Headers were validated with the record: all of them must iterate. */
		if (k != rec.headers_count)
			abort();
		n++;
	}
	if (!it.err && n != b->records_count)
		abort();
}

/* Split into pieces; every piece must parse, be contiguous and carry a valid CRC. */
static void check_split(const km_batch *b)
{
	km_wr out;
	size_t pieces;
	km_wr_init(&out);
	if (km_batch_split_gaps(b, scratch, SCRATCH, &out, &pieces) == KM_OK) {
		km_batch_iter it;
		km_batch pb;
		size_t n = 0;
		km_batch_iter_init(&it, out.buf, out.len);
		while (km_batch_next(&it, &pb)) {
			if (!km_batch_is_contiguous(&pb) || km_batch_verify_crc(pb.data, pb.size) != KM_OK)
				abort();
			n++;
		}
		if (it.err || it.truncated_bytes || n != pieces)
			abort();
	}
	km_wr_free(&out);
}

/* Patch a copy: base offset and epoch keep a valid CRC valid; a restamp always leaves a valid one. */
static void check_patch(const km_batch *b)
{
	uint8_t *copy = malloc(b->size);
	if (!copy)
		return;
	memcpy(copy, b->data, b->size);
	km_err before = km_batch_verify_crc(copy, b->size);
	km_batch_set_base_offset(copy, 0);
	km_batch_set_partition_leader_epoch(copy, 7);
	if (km_batch_verify_crc(copy, b->size) != before)
		abort();
	km_batch_restamp(copy, b->size, 1000, 1, 0);
	if (km_batch_verify_crc(copy, b->size) != KM_OK)
		abort();
	free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	km_batch_iter it;
	km_batch b;
	size_t seen = 0;
	km_batch_iter_init(&it, data, size);
	while (km_batch_next(&it, &b)) {
		if (b.offset != seen || b.size < KM_BATCH_HEADER_SIZE || b.offset + b.size > size)
			abort();
		seen += b.size;
		check_patch(&b);
		if (b.control) {
			km_control c;
			km_err err = km_batch_control(&b, scratch, SCRATCH, &c);
			/* NONE only for a batch without records; an epoch only for COMMIT/ABORT. */
			if (err == KM_OK && ((c.type == KM_CONTROL_NONE) != (b.records_count == 0) ||
					     (c.coordinator_epoch != -1 && c.type != KM_CONTROL_COMMIT &&
					      c.type != KM_CONTROL_ABORT)))
				abort();
		}
		check_records(&b);
		check_split(&b);
	}
	if (!it.err && seen + it.truncated_bytes != size)
		abort();
	return 0;
}
