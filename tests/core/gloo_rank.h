// Rank r of `world` as a thread of the test: a Gloo communicator among the ranks that open
// the same local:// (or tcp://) rendezvous `url`, bound to 127.0.0.1, 20 s timeouts.
#pragma once

#include <memory>
#include <string>

#include "rdzv/rendezvous.h"
#include "rdzv/stores.h"

namespace sxtest {

inline sx::Status connect_gloo(const std::string &url, int r, int world,
                               std::unique_ptr<sx::comm::Communicator> *out) {
    sx::rdzv::Rendezvous rv;
    std::shared_ptr<sx::rdzv::Store> store;
    SX_TRY(sx::rdzv::parse_rendezvous(url.c_str(), r, world, &rv));
    SX_TRY(sx::rdzv::open_store(rv, sx::Millis(20000), &store));
    sx::comm::GlooOptions o;
    o.bind_address = "127.0.0.1";
    o.timeout = sx::Millis(20000);
    return sx::comm::create_gloo_communicator(store, r, world, o, out);
}

}  // namespace sxtest
