/* kmirror's clocks, in milliseconds: monotonic for waits and intervals, wall for what is stored or shown. */
#ifndef KMIRROR_CLOCK_H
#define KMIRROR_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC: never goes back, meaningless across processes. */
int64_t km_mono_ms(void);
/* Since the epoch: the times the state records and Kafka's records carry. */
int64_t km_wall_ms(void);

#endif
