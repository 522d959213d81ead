#include "api_test_util.h"

#include <unistd.h>

void api_unique_rendezvous(char *buf, size_t size) {
    static int counter = 0; /* the tests that use it run on one thread */
    snprintf(buf, size, "local://sx-api-test-%ld-%d", (long)getpid(), ++counter);
}

void api_config(sx_group_config_t *c, char *rv, size_t rv_size, int32_t rank, int32_t world_size) {
    assert_int_equal(sx_group_config_init(c, sizeof *c), SX_OK);
    api_unique_rendezvous(rv, rv_size);
    c->rendezvous = rv;
    c->rank = rank;
    c->world_size = world_size;
    c->timeout_ms = 5000;
    c->num_threads = 1;
    c->backend = SX_BACKEND_CPU;
}

sx_shard_group_t *api_group(void) {
    char rv[128];
    sx_group_config_t c;
    api_config(&c, rv, sizeof rv, 0, 1);
    sx_shard_group_t *g = NULL;
    EXPECT_OK(sx_create_shard_group(&c, &g));
    assert_non_null(g);
    return g;
}

int32_t api_add_group(sx_shard_group_t *g, int32_t optimizer) {
    sx_param_group_desc_t d;
    EXPECT_OK(sx_param_group_desc_init(&d, sizeof d, optimizer));
    int32_t index = -1;
    EXPECT_OK(sx_add_param_group(g, &d, &index));
    assert_true(index >= 0);
    return index;
}

int32_t api_add_param(sx_shard_group_t *g, const char *name, int32_t ndim, const int64_t *shape,
                      int32_t pg, int32_t unit) {
    sx_param_desc_t d;
    EXPECT_OK(sx_param_desc_init(&d, sizeof d));
    d.name = name;
    d.ndim = ndim;
    d.shape = shape;
    d.param_group = pg;
    d.unit = unit;
    int32_t index = -1;
    EXPECT_OK(sx_add_param(g, &d, &index));
    assert_true(index >= 0);
    return index;
}

sx_shard_group_t *api_small_group(int finalize) {
    sx_shard_group_t *g = api_group();
    int32_t pg = api_add_group(g, SX_OPTIM_ADAMW);
    const int64_t w[2] = {4, 8}, b[1] = {8};
    assert_int_equal(api_add_param(g, "w", 2, w, pg, 0), 0);
    assert_int_equal(api_add_param(g, "b", 1, b, pg, 1), 1);
    if (finalize) EXPECT_OK(sx_finalize(g));
    return g;
}

int32_t api_num_params(const sx_shard_group_t *g) {
    int32_t n = -1;
    EXPECT_OK(sx_get_num_params(g, &n));
    return n;
}

int32_t api_num_param_groups(const sx_shard_group_t *g) {
    int32_t n = -1;
    EXPECT_OK(sx_get_num_param_groups(g, &n));
    return n;
}

#define SENTINEL_LEVEL (-777)

static void sentinel_log(int32_t level, const char *message, void *user) {
    (void)level;
    (void)message;
    (void)user;
}

void api_reset_error(void) {
    if (sx_set_log_callback(sentinel_log, NULL, SENTINEL_LEVEL) != SX_ERR_INVALID_ARGUMENT)
        fail_msg("sx_set_log_callback accepted max_level %d", SENTINEL_LEVEL);
}

static int is_sentinel(const char *msg) {
    return strncmp(msg, "sx_set_log_callback:", 20) == 0 && strstr(msg, "-777") != NULL;
}

void api_expect(sx_status_t got, sx_status_t want, const char *needle, const char *what,
                const char *file, int line) {
    const char *msg = sx_last_error_message();
    if (got != want) {
        fail_msg("%s:%d: %s returned %d (%s), expected %d (%s); last error: \"%s\"", file, line,
                 what, (int)got, sx_status_string(got), (int)want, sx_status_string(want),
                 msg ? msg : "(NULL)");
    }
    if (want == SX_OK) return;
    if (msg == NULL || msg[0] == '\0')
        fail_msg("%s:%d: %s failed with %d but sx_last_error_message() is empty", file, line, what,
                 (int)got);
    /* The entry point's name: the identifier `what` begins with. */
    size_t n = strcspn(what, " (");
    if (is_sentinel(msg) && strncmp(what, "sx_set_log_callback", n) != 0)
        fail_msg("%s:%d: %s failed with %d but did not set sx_last_error_message()", file, line,
                 what, (int)got);
    if (strncmp(msg, what, n) != 0 || msg[n] != ':')
        fail_msg("%s:%d: error message \"%s\" does not begin with \"%.*s:\"", file, line, msg,
                 (int)n, what);
    /* The needle must be in the words after "function: " (not in the function's name). */
    if (needle != NULL && strstr(msg + n + 1, needle) == NULL)
        fail_msg("%s:%d: %s: error message \"%s\" does not mention \"%s\"", file, line, what, msg,
                 needle);
}
