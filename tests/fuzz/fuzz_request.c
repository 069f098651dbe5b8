/* libFuzzer harness: every request codec, through the API table (and the request header). */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_messages.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return km_fuzz_messages(data, size, 0);
}
