/* The mirrored partition's state machine: state and op names, and which operator op is valid from which state. */
#include "kmirror/state.h"
#include "state/state_int.h"

static const char *const state_names[KM_MP__COUNT] = {
	[KM_MP_UNKNOWN] = "UNKNOWN",   [KM_MP_PREPARING] = "PREPARING", [KM_MP_MIRRORING] = "MIRRORING",
	[KM_MP_PAUSING] = "PAUSING",   [KM_MP_PAUSED] = "PAUSED",       [KM_MP_STOPPING] = "STOPPING",
	[KM_MP_STOPPED] = "STOPPED",   [KM_MP_FAILED] = "FAILED",
};

const char *km_mp_state_name(km_mp_state s)
{
	return (unsigned)s < KM_MP__COUNT ? state_names[s] : "INVALID";
}

const char *km_topic_op_name(km_topic_op op)
{
	static const char *const names[KM_TOPIC__COUNT] = {"start", "stop", "pause", "resume"};
	return (unsigned)op < KM_TOPIC__COUNT ? names[op] : "invalid";
}

bool km_topic_op_allowed(km_topic_op op, km_mp_state from, km_err *code)
{
	bool ok = false;
	km_err refusal = KM_MIRROR_INVALID_CLUSTER_MIRROR_STATES;

	switch (op) {
	case KM_TOPIC_START:
		ok = from == KM_MP_UNKNOWN || from == KM_MP_STOPPED || from == KM_MP_FAILED;
		/* Mirrored and not yet stopped: the proposal's "already in a mirror". */
		if (!ok && (unsigned)from < KM_MP__COUNT)
			refusal = KM_MIRROR_TOPIC_ALREADY_IN_CLUSTER_MIRROR;
		break;
	case KM_TOPIC_STOP:
		ok = from == KM_MP_PREPARING || from == KM_MP_MIRRORING || from == KM_MP_PAUSED || from == KM_MP_FAILED;
		break;
	case KM_TOPIC_PAUSE:
		ok = from == KM_MP_MIRRORING;
		break;
	case KM_TOPIC_RESUME:
		ok = from == KM_MP_PAUSED;
		if (!ok)
			refusal = KM_MIRROR_MIRROR_TOPIC_NOT_PAUSED;
		break;
	default:
		break;
	}
	if (code)
		*code = ok ? KM_OK : refusal;
	return ok;
}

/* The state the operator's op moves a partition to (the data plane moves it on from there). */
km_mp_state km_topic_op_target(km_topic_op op)
{
	switch (op) {
	case KM_TOPIC_START: return KM_MP_PREPARING;
	case KM_TOPIC_STOP: return KM_MP_STOPPING;
	case KM_TOPIC_PAUSE: return KM_MP_PAUSING;
	case KM_TOPIC_RESUME: return KM_MP_MIRRORING;
	default: return KM_MP_UNKNOWN;
	}
}

bool km_state_settle_allowed(km_mp_state from, km_mp_state to)
{
	if ((unsigned)from >= KM_MP__COUNT || (unsigned)to >= KM_MP__COUNT)
		return false;
	if (from == to)
		return from != KM_MP_UNKNOWN; /* a rewrite of the same state (its error, its offsets) */
	switch (to) {
	case KM_MP_MIRRORING: return from == KM_MP_PREPARING;
	case KM_MP_PAUSED: return from == KM_MP_PAUSING;
	case KM_MP_STOPPED: return from == KM_MP_STOPPING;
	/* The source topic was deleted: the mirror stops (the proposal's STOPPING "on topic deletion"). */
	case KM_MP_STOPPING: return from == KM_MP_MIRRORING;
	/* A stopped topic is the operator's again (writable): nothing fails it back into read-only. */
	case KM_MP_FAILED: return from != KM_MP_STOPPED && from != KM_MP_UNKNOWN;
	default: return false;
	}
}
