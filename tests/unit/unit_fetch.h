/* Unit test helper: walk a whole buffered Fetch response frame to its top-level tagged fields with the one walker. */
#ifndef KMIRROR_UNIT_FETCH_H
#define KMIRROR_UNIT_FETCH_H

#include "kmirror/fetch.h"

static km_err fetch_tags_off(struct evbuffer *b, size_t len, int16_t v, size_t *off)
{
	km_fetch_walk w;
	km_fw_event ev;
	km_fetch_walk_init(&w, v, len);
	while ((ev = km_fetch_walk_next(&w, b, 0)) == KM_FW_PARTITION || ev == KM_FW_BATCH)
		;
	if (ev != KM_FW_END)
		return KM_ERR_DECODE;
	*off = w.pos;
	return KM_OK;
}

#endif
