/* Kafka record batches (magic v2): in-place iteration and patching, records, control records, builder. */
#ifndef KMIRROR_BATCH_H
#define KMIRROR_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "kmirror/compress.h"
#include "kmirror/error.h"
#include "kmirror/wire.h"

/* Byte offsets in a v2 batch header (BROKER-RULES §8). */
enum {
	KM_BATCH_OFF_BASE_OFFSET = 0,
	KM_BATCH_OFF_LENGTH = 8,
	KM_BATCH_OFF_LEADER_EPOCH = 12,
	KM_BATCH_OFF_MAGIC = 16,
	KM_BATCH_OFF_CRC = 17,
	KM_BATCH_OFF_ATTRIBUTES = 21, /* the CRC covers from here to the end of the batch */
	KM_BATCH_OFF_LAST_OFFSET_DELTA = 23,
	KM_BATCH_OFF_BASE_TIMESTAMP = 27,
	KM_BATCH_OFF_MAX_TIMESTAMP = 35,
	KM_BATCH_OFF_PRODUCER_ID = 43,
	KM_BATCH_OFF_PRODUCER_EPOCH = 51,
	KM_BATCH_OFF_BASE_SEQUENCE = 53,
	KM_BATCH_OFF_RECORDS_COUNT = 57,
	KM_BATCH_HEADER_SIZE = 61, /* records start here */
	KM_BATCH_LOG_OVERHEAD = 12, /* baseOffset + batchLength: batch size = 12 + batchLength */
};

/* Attribute bits. */
enum {
	KM_BATCH_ATTR_CODEC_MASK = 0x07,
	KM_BATCH_ATTR_LOG_APPEND_TIME = 0x08,
	KM_BATCH_ATTR_TRANSACTIONAL = 0x10,
	KM_BATCH_ATTR_CONTROL = 0x20,
	KM_BATCH_ATTR_DELETE_HORIZON = 0x40,
};

/* One batch, as the iterator found it. data/records point into the iterated buffer. */
typedef struct km_batch {
	size_t offset;          /* of the batch within the record set (to patch a mutable copy) */
	const uint8_t *data;    /* whole batch */
	size_t size;            /* 12 + batch_length */
	const uint8_t *records; /* records section (compressed as one stream when codec != none) */
	size_t records_size;

	int64_t base_offset;
	int32_t batch_length;
	int32_t partition_leader_epoch;
	int8_t magic;
	uint32_t crc;
	uint16_t attributes;
	int codec;              /* km_codec; values 5-7 are reported as they are */
	bool log_append_time;
	bool transactional;
	bool control;
	bool delete_horizon;    /* base_timestamp is the delete horizon (KIP-534) */
	int32_t last_offset_delta;
	int64_t base_timestamp;
	int64_t max_timestamp;
	int64_t producer_id;
	int16_t producer_epoch;
	int32_t base_sequence;
	int32_t records_count;
} km_batch;

/*
 * Iterator over a record set (a Fetch response's Records, a segment file, a Produce request's
 * records) in place. A last batch cut short (fewer than 12 bytes left, or fewer than 12 + its
 * batch_length) ends the iteration without error and sets truncated_bytes, as Fetch responses carry
 * them. Errors stop the iteration: a batch_length too small for a v2 header (KM_ERR_DECODE), a magic
 * of 0 or 1 (KM_ERR_UNSUPPORTED: v0/v1 message sets are refused, never yielded), any other magic
 * (KM_ERR_DECODE), a negative records count (KM_ERR_DECODE). err_pos is the byte offset of the
 * offending batch, err_what says what was wrong.
 */
typedef struct km_batch_iter {
	const uint8_t *buf;
	size_t len;
	size_t pos;
	km_err err;
	size_t err_pos;
	const char *err_what;
	size_t truncated_bytes; /* bytes of an incomplete last batch, once the iteration has ended */
} km_batch_iter;

void km_batch_iter_init(km_batch_iter *it, const void *buf, size_t len);
/* The next batch; false at the end or on error (then it->err is set). */
bool km_batch_next(km_batch_iter *it, km_batch *b);
/* Parse exactly one batch occupying all of buf/len (e.g. a built batch). */
km_err km_batch_parse(const void *buf, size_t len, km_batch *b) __attribute__((warn_unused_result));

/*
 * Whether a stock broker takes the batch from a producer as it is: not a control batch, at least
 * one record, records_count == last_offset_delta + 1 (BROKER-RULES §1 step 11). A batch that fails
 * only the count rule has offset gaps (compaction) and must go through km_batch_split_gaps.
 */
bool km_batch_is_contiguous(const km_batch *b);

/* ---- checksums and in-place patching of a mutable batch (size = the batch's size) ---- */

/* The CRC-32C the batch should carry, computed over bytes [21, size). */
uint32_t km_batch_compute_crc(const uint8_t *batch, size_t size);
/* KM_OK when the stored CRC matches, KM_ERR_CRC when not, KM_ERR_DECODE when size < 61. */
km_err km_batch_verify_crc(const uint8_t *batch, size_t size) __attribute__((warn_unused_result));
/* Recompute and store the CRC; returns it. */
uint32_t km_batch_update_crc(uint8_t *batch, size_t size);
/* Outside the CRC: the CRC stays valid. */
void km_batch_set_base_offset(uint8_t *batch, int64_t base_offset);
void km_batch_set_partition_leader_epoch(uint8_t *batch, int32_t epoch);
/* Inside the CRC: call km_batch_update_crc afterwards (km_batch_restamp does both). */
void km_batch_set_producer(uint8_t *batch, int64_t producer_id, int16_t producer_epoch, int32_t base_sequence);
/* The base sequence after a batch of n records at seq: sequences wrap from INT32_MAX to 0. */
static inline int32_t km_batch_seq_add(int32_t seq, int32_t n)
{
	return seq > INT32_MAX - n ? n - (INT32_MAX - seq) - 1 : seq + n;
}
uint32_t km_batch_restamp(uint8_t *batch, size_t size, int64_t producer_id, int16_t producer_epoch,
			  int32_t base_sequence);

/*
 * The same over a batch that is not contiguous (e.g. chains of a fetch buffer): the batch is the
 * bytes of v[0..n) in order, split anywhere (inside the header too). Copies its first 61 bytes
 * into hdr, sets baseOffset 0 and the producer fields there, and stores in hdr the CRC32C computed
 * over hdr[21..61) continued over the rest of the pieces; the pieces are only read. The produced
 * batch is then hdr followed by the pieces' bytes from offset 61 on. KM_ERR_DECODE when the pieces
 * hold fewer than 61 bytes, or fewer than the batch length in the header says (12 + batchLength);
 * bytes past the batch are not covered.
 */
km_err km_batch_restamp_iov(const struct iovec *v, size_t n, uint8_t hdr[KM_BATCH_HEADER_SIZE], int64_t producer_id,
			    int16_t producer_epoch, int32_t base_sequence, uint32_t *crc)
	__attribute__((warn_unused_result));

/* ---- records ---- */

/* A header of a record; key and value borrow (value len -1 = null). */
typedef struct km_record_header {
	km_str key;
	km_bytes value;
} km_record_header;

/* A record; key, value and the raw headers section borrow from the (decompressed) records. */
typedef struct km_record {
	int8_t attributes;
	int64_t timestamp_delta;
	int32_t offset_delta;
	int64_t offset;    /* base_offset + offset_delta */
	int64_t timestamp; /* base_timestamp + timestamp_delta, or max_timestamp under LogAppendTime */
	km_bytes key;      /* len -1 = null */
	km_bytes value;    /* len -1 = null */
	int32_t headers_count;
	const uint8_t *headers; /* the encoded headers, for km_record_header_iter_init */
	size_t headers_size;
} km_record;

typedef struct km_record_iter {
	km_rd rd;
	int32_t left;      /* records still to read */
	int64_t base_offset, base_timestamp, max_timestamp;
	bool log_append_time;
	km_err err;
	const char *err_what;
	size_t err_pos;    /* within the (decompressed) records section */
} km_record_iter;

/*
 * Start iterating the records of b. Uncompressed batches are read in place (scratch may be NULL);
 * compressed ones are first decompressed into scratch, at most scratch_cap bytes (else
 * KM_ERR_TOO_LARGE), and the records then borrow from scratch.
 */
km_err km_batch_records(const km_batch *b, uint8_t *scratch, size_t scratch_cap, km_record_iter *it)
	__attribute__((warn_unused_result));
/* Iterate an already uncompressed records section of b (e.g. decompressed by the caller). */
void km_record_iter_init(km_record_iter *it, const km_batch *b, const uint8_t *records, size_t len);
/*
 * The next record; false at the end or on error (it->err). Exactly records_count records are read:
 * fewer bytes than that is an error, and so are bytes left over after the last one. Every record is
 * parsed in full (its length must match its fields), headers included.
 */
bool km_record_next(km_record_iter *it, km_record *rec);

typedef struct km_record_header_iter {
	km_rd rd;
	int32_t left;
} km_record_header_iter;

void km_record_header_iter_init(km_record_header_iter *hi, const km_record *rec);
bool km_record_header_next(km_record_header_iter *hi, km_record_header *h);

/* ---- control records ---- */

typedef enum km_control_type {
	KM_CONTROL_NONE = -2,    /* a control batch with no record (left by the cleaner) */
	KM_CONTROL_UNKNOWN = -1, /* a type this code does not know: skip it */
	KM_CONTROL_ABORT = 0,
	KM_CONTROL_COMMIT = 1,
	KM_CONTROL_LEADER_CHANGE = 2,
	KM_CONTROL_SNAPSHOT_HEADER = 3,
	KM_CONTROL_SNAPSHOT_FOOTER = 4,
	KM_CONTROL_KRAFT_VERSION = 5,
	KM_CONTROL_KRAFT_VOTERS = 6,
} km_control_type;

typedef struct km_control {
	km_control_type type;
	int16_t raw_type;         /* the type id as written */
	int16_t version;          /* key version */
	int32_t coordinator_epoch; /* COMMIT/ABORT only, else -1 */
} km_control;

/* "ABORT", "COMMIT", ..., "UNKNOWN", "NONE". */
const char *km_control_type_name(km_control_type t);
/* Parse one control record (key: int16 version, int16 type; COMMIT/ABORT value: int16 version,
 * int32 coordinator epoch). KM_ERR_DECODE on a short key/value or a negative version. */
km_err km_control_parse(const km_record *rec, km_control *c) __attribute__((warn_unused_result));
/* The control record of a control batch (its first record, the only one Kafka writes); type NONE
 * when it has none. KM_ERR_INVAL if b is not a control batch. Control batches are uncompressed;
 * a compressed one is decompressed into scratch. */
km_err km_batch_control(const km_batch *b, uint8_t *scratch, size_t scratch_cap, km_control *c)
	__attribute__((warn_unused_result));

/* ---- building ---- */

/* A record to build; timestamps are absolute, offset deltas strictly increasing from >= 0. */
typedef struct km_batch_record {
	int64_t timestamp;
	int32_t offset_delta;
	km_bytes key;   /* len -1 = null */
	km_bytes value; /* len -1 = null */
	const km_record_header *headers;
	size_t headers_count;
} km_batch_record;

typedef struct km_batch_params {
	int codec;               /* km_codec */
	int level;               /* compression level, 0 = default */
	int64_t base_offset;
	int32_t partition_leader_epoch;
	int64_t producer_id;     /* -1 = none */
	int16_t producer_epoch;  /* -1 = none */
	int32_t base_sequence;   /* -1 = none */
	bool transactional;
	bool control;
	bool log_append_time;    /* then max_timestamp below is the batch's MaxTimestamp */
	int64_t max_timestamp;   /* used only with log_append_time */
	int32_t last_offset_delta; /* -1 = the last record's offset delta; larger keeps a trailing gap */
} km_batch_params;

/* Defaults: no codec, base offset 0, epoch -1, no producer, lastOffsetDelta from the records. */
void km_batch_params_init(km_batch_params *p);

/*
 * Append one v2 batch of n >= 1 records to out: baseTimestamp = the first record's timestamp,
 * maxTimestamp = the largest, lastOffsetDelta = the last record's delta (unless overridden), records
 * compressed as one stream with p->codec, CRC computed. KM_ERR_INVAL for no records or deltas that
 * do not increase; KM_ERR_TOO_LARGE when the batch would pass 2 GiB.
 */
km_err km_batch_build(const km_batch_params *p, const km_batch_record *recs, size_t n, km_wr *out)
	__attribute__((warn_unused_result));

/*
 * Re-encode a batch whose records have offset gaps (a compacted source batch) into contiguous pieces,
 * appended to out in order: one batch per run of consecutive offsets, with base offset = the run's
 * first offset, deltas 0..k-1, the same codec, attributes (transactional, LogAppendTime with the same
 * MaxTimestamp), partition leader epoch and producer id/epoch, base sequence advanced by the run's
 * first delta (when there is one), and the records' keys, values, headers and timestamps. A batch
 * without records gives no piece; a control batch is KM_ERR_INVAL. scratch/scratch_cap: room to
 * decompress into when compressed. *pieces counts the batches appended.
 */
km_err km_batch_split_gaps(const km_batch *b, uint8_t *scratch, size_t scratch_cap, km_wr *out, size_t *pieces)
	__attribute__((warn_unused_result));

/*
 * The header a LogAppendTime batch b goes to a CreateTime topic with, so that the broker stores it
 * as it is and its MaxTimestamp stays the append time (docs/mirror.md, "LogAppendTime sources"):
 * into hdr (b's first KM_BATCH_HEADER_SIZE bytes, copied by the caller), baseTimestamp = MaxTimestamp
 * - the largest record timestamp delta, and the LogAppendTime and delete-horizon bits cleared. The
 * records are read (decompressed into scratch, scratch_cap bytes, when compressed) and never
 * changed; the CRC in hdr is left to the caller. KM_ERR_INVAL when b is not LogAppendTime or has no
 * record.
 */
km_err km_batch_append_time_as_create(const km_batch *b, uint8_t *scratch, size_t scratch_cap,
				      uint8_t hdr[KM_BATCH_HEADER_SIZE]) __attribute__((warn_unused_result));

#endif
