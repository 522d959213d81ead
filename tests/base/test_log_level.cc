// SX_LOG_LEVEL: its values parsed (names in any case, numbers, spaces) and bad ones
// refused in words; and, in child processes (the variable is read once per process),
// messages up to its level on stderr without a callback, nothing without the variable,
// a bad value reported on stderr or to the callback set first, and a program's callback
// winning over the variable.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <unistd.h>

#include "sx_cmocka.h"

#include "base/log.h"
#include "sx/sx.h"

namespace {

void test_parse(void **) {
    const struct {
        const char *text;
        int level;
    } good[] = {{"OFF", 0},   {"none", 0},        {"error", SX_LOG_ERROR}, {"Warn", SX_LOG_WARN},
                {"WARNING", SX_LOG_WARN},         {"info", SX_LOG_INFO},   {" DEBUG\n", SX_LOG_DEBUG},
                {"trace", SX_LOG_DEBUG},          {"0", 0},                {"1", SX_LOG_ERROR},
                {"4", SX_LOG_DEBUG},              {"\t3 ", SX_LOG_INFO}};
    for (const auto &g : good) {
        int level = -1;
        std::string error;
        if (!sx::parse_log_level(g.text, &level, &error)) fail_msg("'%s' refused: %s", g.text, error.c_str());
        assert_int_equal(level, g.level);
    }
    const char *bad[] = {"", "  ", "5", "-1", "3x", "verbose", "INFOO", "1.0", "debug info"};
    for (const char *b : bad) {
        int level = 77;
        std::string error;
        if (sx::parse_log_level(b, &level, &error)) fail_msg("'%s' accepted as level %d", b, level);
        assert_int_equal(level, 77);
        assert_non_null(std::strstr(error.c_str(), ("SX_LOG_LEVEL='" + std::string(b) + "'").c_str()));
        assert_non_null(std::strstr(error.c_str(), "ERROR, WARN, INFO, DEBUG"));
    }
}

void print_callback(int32_t level, const char *message, void *) {
    std::printf("CB %d %s\n", level, message);
    std::fflush(stdout);
}

// A child: optionally sets a callback at WARN first, then makes a group (an INFO message),
// fails a call (a DEBUG message) and destroys the group.
int child_main(const char *mode, const char *rendezvous) {
    if (std::strcmp(mode, "callback-warn") == 0) sx_set_log_callback(print_callback, nullptr, SX_LOG_WARN);
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rendezvous;
    cfg.world_size = 1;
    sx_shard_group_t *g = nullptr;
    if (sx_create_shard_group(&cfg, &g) != SX_OK) return 3;
    if (sx_get_rank(g, nullptr) == SX_OK) return 4;  // fails: a DEBUG message
    sx_destroy_shard_group(g);
    return 0;
}

// The child's stdout and stderr with SX_LOG_LEVEL = value (null: unset).
std::string run_child(const char *value, const char *mode) {
    if (value) {
        setenv("SX_LOG_LEVEL", value, 1);
    } else {
        unsetenv("SX_LOG_LEVEL");
    }
    static int n = 0;
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);  // the shell's own, under popen
    assert_true(len > 0);
    self[len] = '\0';
    const std::string cmd = std::string(self) + " --log-child " + mode + " local://log-level-" +
                            std::to_string(getpid()) + "-" + std::to_string(n++) + " 2>&1";
    FILE *p = popen(cmd.c_str(), "r");
    assert_non_null(p);
    std::string out;
    char buf[4096];
    size_t k;
    while ((k = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, k);
    const int rc = pclose(p);
    unsetenv("SX_LOG_LEVEL");
    if (rc != 0) fail_msg("the child (SX_LOG_LEVEL=%s, %s) failed (%d): %s", value ? value : "unset", mode, rc,
                          out.c_str());
    return out;
}

bool has(const std::string &out, const char *text) { return out.find(text) != std::string::npos; }

void test_no_variable_prints_nothing(void **) {
    const std::string out = run_child(nullptr, "plain");
    if (!out.empty()) fail_msg("printed without SX_LOG_LEVEL: %s", out.c_str());
}

void test_levels_to_stderr(void **) {
    std::string out = run_child("info", "plain");
    assert_true(has(out, "[sx INFO] sx: rank 0 of 1 joined"));
    assert_false(has(out, "[sx DEBUG]"));
    out = run_child(" Debug ", "plain");
    assert_true(has(out, "[sx INFO] sx: rank 0 of 1 joined"));
    assert_true(has(out, "[sx DEBUG] sx_get_rank"));
    out = run_child("2", "plain");
    assert_false(has(out, "[sx INFO]"));
    assert_false(has(out, "[sx DEBUG]"));
    out = run_child("OFF", "plain");
    if (!out.empty()) fail_msg("printed with SX_LOG_LEVEL=OFF: %s", out.c_str());
}

void test_bad_value_reported(void **) {
    for (const char *bad : {"bogus", "5"}) {
        const std::string out = run_child(bad, "plain");
        const std::string expected = std::string("[sx ERROR] SX_LOG_LEVEL='") + bad + "' is not a log level";
        if (!has(out, expected.c_str())) fail_msg("SX_LOG_LEVEL=%s: not reported on stderr: %s", bad, out.c_str());
        assert_false(has(out, "[sx INFO]"));
    }
    // The callback set first gets the complaint; nothing goes to stderr.
    const std::string out = run_child("bogus", "callback-warn");
    if (!has(out, "CB 1 SX_LOG_LEVEL='bogus' is not a log level"))
        fail_msg("the callback did not get the complaint: %s", out.c_str());
    assert_false(has(out, "[sx "));
}

void test_callback_wins(void **) {
    // The program asked for warnings and errors only: SX_LOG_LEVEL=debug does not change that.
    const std::string out = run_child("debug", "callback-warn");
    assert_false(has(out, "CB 3"));
    assert_false(has(out, "CB 4"));
    assert_false(has(out, "[sx "));
}

}  // namespace

int main(int argc, char **argv) {
    if (argc == 4 && std::strcmp(argv[1], "--log-child") == 0) return child_main(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_no_variable_prints_nothing),
        cmocka_unit_test(test_levels_to_stderr),
        cmocka_unit_test(test_bad_value_reported),
        cmocka_unit_test(test_callback_wins),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
