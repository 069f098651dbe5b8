/* Lookups over the generated API table, and the header version rules. */
#include <stdlib.h>

#include "kmirror/api.h"

static int cmp_key(const void *key, const void *row)
{
	int16_t k = *(const int16_t *)key;
	const km_api_info *api = row;
	return (k > api->api_key) - (k < api->api_key);
}

const km_api_info *km_api_lookup(int16_t api_key)
{
	size_t n;
	const km_api_info *rows = km_api_table(&n);
	return bsearch(&api_key, rows, n, sizeof(rows[0]), cmp_key);
}

bool km_api_version_supported(int16_t api_key, int16_t version)
{
	const km_api_info *api = km_api_lookup(api_key);
	return api && version >= api->min_version && version <= api->max_version;
}

bool km_api_is_flexible(const km_api_info *api, int16_t version)
{
	return api->first_flexible >= 0 && version >= api->first_flexible;
}

int km_api_request_header_version(int16_t key, int16_t version)
{
	const km_api_info *api = km_api_lookup(key);
	if (!api || version < api->min_version || version > api->max_version)
		return -1;
	if (version <= api->request_header_v0_max)
		return 0;
	return km_api_is_flexible(api, version) ? 2 : 1;
}

int km_api_response_header_version(int16_t key, int16_t version)
{
	const km_api_info *api = km_api_lookup(key);
	if (!api || version < api->min_version || version > api->max_version)
		return -1;
	if (api->response_header_always_v0)
		return 0;
	return km_api_is_flexible(api, version) ? 1 : 0;
}
