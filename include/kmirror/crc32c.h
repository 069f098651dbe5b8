/* CRC-32C (Castagnoli), the checksum of Kafka record batches: hardware when the CPU has it. */
#ifndef KMIRROR_CRC32C_H
#define KMIRROR_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * CRC-32C of n bytes at p, continuing from crc (pass 0 to start). The pre- and post-inversion are
 * done inside, so km_crc32c(km_crc32c(0, a, na), b, nb) equals the CRC of a followed by b, and
 * km_crc32c(0, "123456789", 9) == 0xE3069283. Picks the SSE4.2 instruction when the CPU has it.
 */
uint32_t km_crc32c(uint32_t crc, const void *p, size_t n);

/*
 * The CRC of a len-byte message whose n bytes at offset at changed from before to after, from its
 * CRC before the change, without reading the rest of the message (at + n <= len): a record batch's
 * header field changes while its records stream past (the proxy sets LogAppendTime back on
 * mirrored batches as a Fetch response goes by).
 */
uint32_t km_crc32c_patch(uint32_t crc, size_t len, size_t at, const void *before, const void *after, size_t n);

/* The slicing-by-8 table path, always available. */
uint32_t km_crc32c_table(uint32_t crc, const void *p, size_t n);

/* The hardware path; falls back to the table path when km_crc32c_hw_available() is false. */
uint32_t km_crc32c_hw(uint32_t crc, const void *p, size_t n);
bool km_crc32c_hw_available(void);

/*
 * Force km_crc32c onto the table path (tests, benchmarks) or back to the best path. Not for use
 * while other threads compute CRCs.
 */
void km_crc32c_force_table(bool on);

/* "sse4.2" or "table": what km_crc32c uses now. */
const char *km_crc32c_impl(void);

#endif
