// parse_rendezvous: every scheme, env:// with each launcher's variables (serving sx's
// store or joining torchrun's), and the errors, which must name what is wrong.
#include "rdzv/rendezvous.h"
#include "comm_test_util.h"

using sx::rdzv::parse_rendezvous;
using sx::rdzv::Rendezvous;
using sxtest::contains;

namespace {

const char *const kVariables[] = {"RANK",
                                  "WORLD_SIZE",
                                  "OMPI_COMM_WORLD_RANK",
                                  "OMPI_COMM_WORLD_SIZE",
                                  "SLURM_PROCID",
                                  "SLURM_NTASKS",
                                  "MASTER_ADDR",
                                  "MASTER_PORT",
                                  "SX_ENV_STORE",
                                  "TORCHELASTIC_USE_AGENT_STORE",
                                  "TORCHELASTIC_RUN_ID",
                                  "TORCHELASTIC_RESTART_COUNT"};

int clear_environment(void **) {
    for (const char *v : kVariables) unsetenv(v);
    return 0;
}

// Parses and expects an invalid-argument error whose message contains `part`.
void expect_error(const char *url, int rank, int world, const char *part) {
    Rendezvous rv;
    sx::Status s = parse_rendezvous(url, rank, world, &rv);
    if (s.code() != SX_ERR_INVALID_ARGUMENT || !contains(s.message(), part)) {
        print_error("parse_rendezvous(\"%s\", %d, %d): code %d, message \"%s\"; expected INVALID_ARGUMENT "
                    "naming \"%s\"\n",
                    url ? url : "(null)", rank, world, s.code(), s.message().c_str(), part);
        fail();
    }
}

void test_local(void **) {
    Rendezvous rv;
    ASSERT_OK(parse_rendezvous("local://job-a", 1, 3, &rv));
    assert_true(rv.scheme == Rendezvous::Scheme::kLocal);
    assert_string_equal(rv.name.c_str(), "job-a");
    assert_string_equal(rv.url.c_str(), "local://job-a");
    assert_int_equal(rv.rank, 1);
    assert_int_equal(rv.world_size, 3);
}

void test_file(void **) {
    Rendezvous rv;
    ASSERT_OK(parse_rendezvous("file:///shared/run 7", 0, 1, &rv));
    assert_true(rv.scheme == Rendezvous::Scheme::kFile);
    assert_string_equal(rv.path.c_str(), "/shared/run 7");
}

void test_tcp(void **) {
    Rendezvous rv;
    ASSERT_OK(parse_rendezvous("tcp://10.1.2.3:29500", 2, 4, &rv));
    assert_true(rv.scheme == Rendezvous::Scheme::kTcp);
    assert_string_equal(rv.host.c_str(), "10.1.2.3");
    assert_int_equal(rv.port, 29500);
    ASSERT_OK(parse_rendezvous("tcp://node-07.cluster:1", 0, 1, &rv));
    assert_string_equal(rv.host.c_str(), "node-07.cluster");
    assert_int_equal(rv.port, 1);
    ASSERT_OK(parse_rendezvous("tcp://[::1]:65535", 0, 1, &rv));
    assert_string_equal(rv.host.c_str(), "::1");
    assert_int_equal(rv.port, 65535);
    assert_false(rv.external);
    // Served by the sx-rendezvous command: rank 0 serves nothing.
    ASSERT_OK(parse_rendezvous("tcp://10.1.2.3:29500?server=external", 2, 4, &rv));
    assert_true(rv.external);
    assert_string_equal(rv.host.c_str(), "10.1.2.3");
    assert_int_equal(rv.port, 29500);
    ASSERT_OK(parse_rendezvous("tcp://[::1]:7?server=external", 0, 1, &rv));
    assert_true(rv.external);
    assert_string_equal(rv.host.c_str(), "::1");
}

void test_tcp_errors(void **) {
    expect_error("tcp://node-07", 0, 1, "no port");
    expect_error("tcp://node-07:", 0, 1, "port ''");
    expect_error("tcp://node-07:0", 0, 1, "port '0'");
    expect_error("tcp://node-07:65536", 0, 1, "port '65536'");
    expect_error("tcp://node-07:29x", 0, 1, "port '29x'");
    expect_error("tcp://:29500", 0, 1, "no host");
    expect_error("tcp://::1:29500", 0, 1, "brackets");
    expect_error("tcp://[::1:29500", 0, 1, "closing ']'");
    expect_error("tcp://[::1]", 0, 1, "no port");
    expect_error("tcp://node-07:29500?server=rank0", 0, 1, "'?server=rank0'");
    expect_error("tcp://node-07:29500?", 0, 1, "'?server=external'");
    expect_error("tcp://node-07?server=external", 0, 1, "no port");
}

void test_rank_errors(void **) {
    expect_error("local://x", 3, 3, "rank 3");
    expect_error("local://x", -1, 3, "rank -1");
    expect_error("local://x", 0, -2, "world_size -2");
    expect_error("local://", 0, 1, "no name");
    expect_error("file://", 0, 1, "no directory");
    expect_error("udp://host:1", 0, 1, "'udp://'");
    expect_error("somewhere", 0, 1, "unknown rendezvous scheme");
    expect_error("", 0, 1, "empty");
    expect_error(nullptr, 0, 1, "empty");
}

void test_env_torchrun(void **) {
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("MASTER_ADDR", "trainer-0", 1);
    setenv("MASTER_PORT", "29400", 1);
    // mpirun's variables are there too; torchrun's come first.
    setenv("OMPI_COMM_WORLD_RANK", "5", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
    Rendezvous rv;
    ASSERT_OK(parse_rendezvous("env://", 0, 0, &rv));
    assert_true(rv.scheme == Rendezvous::Scheme::kTcp);
    assert_string_equal(rv.host.c_str(), "trainer-0");
    assert_int_equal(rv.port, 29400);
    assert_int_equal(rv.rank, 3);
    assert_int_equal(rv.world_size, 8);
    // env:// ignores the rank and world size given as arguments.
    ASSERT_OK(parse_rendezvous("env://", 1, 2, &rv));
    assert_int_equal(rv.rank, 3);
    assert_int_equal(rv.world_size, 8);
}

void test_env_mpirun(void **) {
    setenv("OMPI_COMM_WORLD_RANK", "5", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
    setenv("MASTER_ADDR", "[fe80::1]", 1);
    setenv("MASTER_PORT", "1234", 1);
    Rendezvous rv;
    ASSERT_OK(parse_rendezvous("env://", 0, 0, &rv));
    assert_int_equal(rv.rank, 5);
    assert_int_equal(rv.world_size, 6);
    assert_string_equal(rv.host.c_str(), "fe80::1");
}

void test_env_srun(void **) {
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "2", 1);
    setenv("MASTER_ADDR", "10.0.0.1", 1);
    setenv("MASTER_PORT", "5000", 1);
    Rendezvous rv;
    ASSERT_OK(parse_rendezvous("env://", 0, 0, &rv));
    assert_int_equal(rv.rank, 0);
    assert_int_equal(rv.world_size, 2);
    assert_string_equal(rv.host.c_str(), "10.0.0.1");
    assert_int_equal(rv.port, 5000);
}

// env:// serves sx's store on MASTER_PORT, or joins the one torchrun's agent serves
// there when TORCHELASTIC_USE_AGENT_STORE says so; SX_ENV_STORE decides either way.
void test_env_serve_or_join(void **) {
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "10.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
    Rendezvous rv;
    ASSERT_OK(parse_rendezvous("env://", 0, 0, &rv));  // no agent store: serve
    assert_true(rv.scheme == Rendezvous::Scheme::kTcp);

    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);  // as torchrun sets them
    setenv("TORCHELASTIC_RUN_ID", "job-7", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
    ASSERT_OK(parse_rendezvous("env://", 0, 0, &rv));
    assert_true(rv.scheme == Rendezvous::Scheme::kC10d);
    assert_string_equal(rv.host.c_str(), "10.0.0.1");
    assert_int_equal(rv.port, 29500);
    assert_int_equal(rv.rank, 1);
    assert_string_equal(rv.key_prefix.c_str(), "sx/job-7/2/");

    setenv("SX_ENV_STORE", "serve", 1);
    ASSERT_OK(parse_rendezvous("env://", 0, 0, &rv));
    assert_true(rv.scheme == Rendezvous::Scheme::kTcp);
    assert_false(rv.external);
    setenv("SX_ENV_STORE", "external", 1);  // the sx-rendezvous command serves at MASTER_PORT
    ASSERT_OK(parse_rendezvous("env://", 0, 0, &rv));
    assert_true(rv.scheme == Rendezvous::Scheme::kTcp);
    assert_true(rv.external);

    // TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: the agent serves nothing at MASTER_PORT.
    unsetenv("SX_ENV_STORE");
    setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1);
    ASSERT_OK(parse_rendezvous("env://", 0, 0, &rv));
    assert_true(rv.scheme == Rendezvous::Scheme::kTcp);

    // Joining outside torchrun: a store served by other means.
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    unsetenv("TORCHELASTIC_RUN_ID");
    unsetenv("TORCHELASTIC_RESTART_COUNT");
    setenv("SX_ENV_STORE", "join", 1);
    ASSERT_OK(parse_rendezvous("env://", 0, 0, &rv));
    assert_true(rv.scheme == Rendezvous::Scheme::kC10d);
    assert_string_equal(rv.key_prefix.c_str(), "sx/none/0/");

    setenv("SX_ENV_STORE", "c10d", 1);
    expect_error("env://", 0, 0, "SX_ENV_STORE='c10d'");
    // Only env:// reads it.
    Rendezvous tcp;
    ASSERT_OK(parse_rendezvous("tcp://127.0.0.1:4000", 0, 2, &tcp));
    assert_true(tcp.scheme == Rendezvous::Scheme::kTcp);
}

void test_world_size_zero_reads_environment(void **) {
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    Rendezvous rv;
    ASSERT_OK(parse_rendezvous("tcp://127.0.0.1:4000", 7, 0, &rv));
    assert_string_equal(rv.host.c_str(), "127.0.0.1");
    assert_int_equal(rv.rank, 1);
    assert_int_equal(rv.world_size, 2);
}

void test_env_errors(void **) {
    expect_error("env://", 0, 0, "RANK and WORLD_SIZE");  // nothing set
    setenv("RANK", "1", 1);
    expect_error("env://", 0, 0, "WORLD_SIZE");
    setenv("WORLD_SIZE", "2", 1);
    expect_error("env://", 0, 0, "MASTER_ADDR");
    setenv("MASTER_ADDR", "h", 1);
    expect_error("env://", 0, 0, "MASTER_PORT");
    setenv("MASTER_PORT", "http", 1);
    expect_error("env://", 0, 0, "MASTER_PORT");
    setenv("MASTER_PORT", "80", 1);
    Rendezvous rv;
    ASSERT_OK(parse_rendezvous("env://", 0, 0, &rv));
    setenv("RANK", "2", 1);
    expect_error("env://", 0, 0, "RANK='2'");
    setenv("RANK", "one", 1);
    expect_error("env://", 0, 0, "RANK='one'");
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "0", 1);
    expect_error("env://", 0, 0, "WORLD_SIZE='0'");
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    setenv("SLURM_NTASKS", "4", 1);
    expect_error("env://", 0, 0, "SLURM_PROCID");
    expect_error("env://rank0:29500", 0, 0, "takes no address");
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_local, clear_environment),
        cmocka_unit_test_setup(test_file, clear_environment),
        cmocka_unit_test_setup(test_tcp, clear_environment),
        cmocka_unit_test_setup(test_tcp_errors, clear_environment),
        cmocka_unit_test_setup(test_rank_errors, clear_environment),
        cmocka_unit_test_setup(test_env_torchrun, clear_environment),
        cmocka_unit_test_setup(test_env_mpirun, clear_environment),
        cmocka_unit_test_setup(test_env_srun, clear_environment),
        cmocka_unit_test_setup(test_env_serve_or_join, clear_environment),
        cmocka_unit_test_setup(test_world_size_zero_reads_environment, clear_environment),
        cmocka_unit_test_setup(test_env_errors, clear_environment),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
