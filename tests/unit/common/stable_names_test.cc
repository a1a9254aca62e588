// The stable-names contract (common/stable_names.h) and the assignment's pod addresses (common/rendezvous_protocol.h):
// what the operator and the agent agree on without depending on each other.
#include "common/stable_names.h"

#include <doctest/doctest.h>

#include <string>

#include "common/rendezvous_protocol.h"

namespace names = railyard::names;
namespace rdzv = railyard::rdzv;

TEST_CASE("DNS labels and names as Kubernetes checks them") {
  const std::string l63(63, 'a'), l64(64, 'a');
  for (const std::string& ok : {std::string("a"), std::string("job"), std::string("a-b"), std::string("x9"),
                                std::string("job-worker-12"), l63}) {
    INFO(ok);
    CHECK(names::is_dns1123_label(ok));
    CHECK(names::is_dns1035_label(ok));
  }
  CHECK(names::is_dns1123_label("9job"));
  CHECK_FALSE(names::is_dns1035_label("9job"));  // a Service name starts with a letter
  for (const std::string& bad : {std::string(""), std::string("-a"), std::string("a-"), std::string("A"),
                                 std::string("a.b"), std::string("a_b"), std::string("a b"), l64}) {
    INFO(bad);
    CHECK_FALSE(names::is_dns1123_label(bad));
    CHECK_FALSE(names::is_dns1035_label(bad));
  }
  CHECK(names::is_dns_subdomain("cluster.local"));
  CHECK(names::is_dns_subdomain("job-worker-0.job.team-a.svc.cluster.local"));
  for (const char* bad : {"", ".", "cluster.", ".local", "a..b", "Cluster.local", "a.-b", "a b.c"}) {
    INFO(bad);
    CHECK_FALSE(names::is_dns_subdomain(bad));
  }
  std::string long_name;
  while (long_name.size() < 250) long_name += "abcdefghi.";
  long_name += "xyz";  // 253 characters
  CHECK(names::is_dns_subdomain(long_name));
  CHECK_FALSE(names::is_dns_subdomain(long_name + "z"));
}

TEST_CASE("a pod's name and the hostfile") {
  const std::string domain = names::pod_domain("ddp", "team-a", names::kDefaultClusterDomain);
  CHECK(domain == "ddp.team-a.svc.cluster.local");
  CHECK(names::pod_fqdn("ddp-worker-1", domain) == "ddp-worker-1.ddp.team-a.svc.cluster.local");
  CHECK(names::hostfile_text({"a.x", "b.x", "c.x"}, 8) == "a.x slots=8\nb.x slots=8\nc.x slots=8\n");
  CHECK(names::hostfile_text({}, 1).empty());
}

TEST_CASE("the assignment carries every pod's address, one per pod, and refuses any other shape") {
  rdzv::Assignment a;
  a.generation = 2;
  a.world_size = 2;
  a.num_pods = 2;
  a.pod_index = 1;
  a.local_world_size = 1;
  a.ranks = {1};
  a.master_addr = "10.0.0.5";
  a.master_port = 29500;
  a.pods = {"p0", "p1"};
  a.peers = {"", ""};
  a.addresses = {"10.0.0.5", "10.0.0.6"};
  nlohmann::json j = rdzv::to_json(a);
  CHECK(rdzv::parse_assignment(j).addresses == a.addresses);
  // From a service that predates it: none.
  nlohmann::json old = j;
  old.erase("addresses");
  CHECK(rdzv::parse_assignment(old).addresses.empty());
  for (const nlohmann::json& bad :
       {nlohmann::json::array({"10.0.0.5"}), nlohmann::json::array({"10.0.0.5", 6}), nlohmann::json("10.0.0.5")}) {
    INFO(bad.dump());
    nlohmann::json b = j;
    b["addresses"] = bad;
    CHECK_THROWS_WITH_AS(rdzv::parse_assignment(b), "field 'addresses' must be an array of strings, one per pod",
                         rdzv::ProtocolError);
  }
}
