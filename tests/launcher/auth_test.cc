// Who a front says is calling: the node's rules and the gateway's, from
// one Authenticator.
#include "launcher/front/auth.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <string>

#include "common/crypto.h"

namespace strata::launcher {
namespace {

using Request = HttpServer::Request;

Tenant MakeTenant(const std::string& name, const std::string& token, bool gateway = false) {
  Tenant t;
  t.name = name;
  t.token_sha256 = *Sha256Hex(token);
  t.limits.gateway = gateway;
  return t;
}

Request Tcp(const std::string& token = "", const std::string& tenant = "") {
  Request r;
  r.method = "GET";
  r.path = "/v1/sandboxes";
  r.peer_address = "127.0.0.1";
  if (!token.empty()) r.headers["authorization"] = "Bearer " + token;
  if (!tenant.empty()) r.headers[kTenantHeader] = tenant;
  return r;
}

Request Unix(uid_t uid, gid_t gid) {
  Request r = Tcp();
  r.peer_address.clear();
  r.unix_peer = true;
  r.peer_uid = uid;
  r.peer_gid = gid;
  r.peer_pid = ::getpid();
  return r;
}

AuthPolicy NodePolicy(bool insecure = false, gid_t group = static_cast<gid_t>(-1)) {
  return {.who = "launcher", .unix_operator = true, .operator_group = group, .open_without_tokens = insecure,
          .gateway_credentials = true};
}
AuthPolicy GatewayPolicy() { return {.who = "gateway", .open_without_tokens = true}; }

void AddTenants(Authenticator& auth) {
  auth.SetTenants({MakeTenant("alice", "st_alice"), MakeTenant("bob", "st_bob"), MakeTenant("gw", "st_gw", true)});
}

TEST(AuthTest, RootOrTheGroupOnTheNodesSocketIsTheOperator) {
  Authenticator auth(NodePolicy(false, 4242));
  AddTenants(auth);
  auto root = auth.Authenticate(Unix(0, 0));
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  EXPECT_TRUE(root->is_operator);
  auto member = auth.Authenticate(Unix(1000, 4242));  // by its primary group
  ASSERT_TRUE(member.ok()) << member.status().ToString();
  EXPECT_TRUE(member->is_operator);
  // Anyone else on the socket needs a token like a TCP caller.
  auto other = auth.Authenticate(Unix(1000, 1000));
  EXPECT_EQ(other.status().code(), ENOKEY);
  Request with_token = Unix(1000, 1000);
  with_token.headers["authorization"] = "Bearer st_bob";
  auto bob = auth.Authenticate(with_token);
  ASSERT_TRUE(bob.ok()) << bob.status().ToString();
  EXPECT_EQ(bob->scope(), "bob");
}

TEST(AuthTest, ATokenIsItsTenantAndAWrongOneIsRefused) {
  Authenticator auth(NodePolicy());
  AddTenants(auth);
  auto alice = auth.Authenticate(Tcp("st_alice"));
  ASSERT_TRUE(alice.ok()) << alice.status().ToString();
  EXPECT_FALSE(alice->is_operator);
  EXPECT_EQ(alice->scope(), "alice");
  EXPECT_EQ(auth.Authenticate(Tcp()).status().code(), ENOKEY);
  EXPECT_EQ(auth.Authenticate(Tcp("st_mallory")).status().code(), EKEYREJECTED);
  // A tenant may name itself, never another.
  EXPECT_TRUE(auth.Authenticate(Tcp("st_alice", "alice")).ok());
  auto other = auth.Authenticate(Tcp("st_alice", "bob"));
  EXPECT_EQ(other.status().code(), EPERM);
  EXPECT_NE(other.status().message().find("launcher:"), std::string::npos) << other.status().ToString();
}

TEST(AuthTest, TheNodeLetsAGatewayActForTheTenantItNames) {
  Authenticator auth(NodePolicy());
  AddTenants(auth);
  auto bob = auth.Authenticate(Tcp("st_gw", "bob"));
  ASSERT_TRUE(bob.ok()) << bob.status().ToString();
  EXPECT_EQ(bob->scope(), "bob");
  auto op = auth.Authenticate(Tcp("st_gw"));  // an operator's call, passed on
  ASSERT_TRUE(op.ok()) << op.status().ToString();
  EXPECT_TRUE(op->is_operator);
  EXPECT_EQ(auth.Authenticate(Tcp("st_gw", "carol")).status().code(), EKEYREJECTED);
  // A gateway cannot name another gateway to become it.
  EXPECT_EQ(auth.Authenticate(Tcp("st_gw", "gw")).status().code(), EKEYREJECTED);
}

TEST(AuthTest, TheGatewayRefusesAGatewaysCredential) {
  Authenticator auth(GatewayPolicy());
  AddTenants(auth);
  auto refused = auth.Authenticate(Tcp("st_gw", "bob"));
  EXPECT_EQ(refused.status().code(), EPERM);
  EXPECT_NE(refused.status().message().find("gateway:"), std::string::npos) << refused.status().ToString();
  auto alice = auth.Authenticate(Tcp("st_alice"));
  ASSERT_TRUE(alice.ok()) << alice.status().ToString();
  EXPECT_EQ(alice->scope(), "alice");
  // A gateway has no socket whose peers are the operator.
  EXPECT_EQ(auth.Authenticate(Unix(0, 0)).status().code(), ENOKEY);
}

TEST(AuthTest, WithoutTokensAnOpenFrontsCallersAreTheOperator) {
  Authenticator node(NodePolicy(/*insecure=*/true));
  auto op = node.Authenticate(Tcp());
  ASSERT_TRUE(op.ok()) << op.status().ToString();
  EXPECT_TRUE(op->is_operator);
  // It cannot act for a tenant: it knows none.
  EXPECT_EQ(node.Authenticate(Tcp("", "alice")).status().code(), EPERM);
  // A node without --insecure has no open door (its TCP listeners are
  // refused at start; here: no caller gets in without root).
  Authenticator closed(NodePolicy(false));
  EXPECT_FALSE(closed.Authenticate(Tcp()).ok());
  EXPECT_FALSE(closed.Authenticate(Unix(1000, 1000)).ok());
  Authenticator gateway(GatewayPolicy());
  auto open = gateway.Authenticate(Tcp());
  ASSERT_TRUE(open.ok()) << open.status().ToString();
  EXPECT_TRUE(open->is_operator);
}

TEST(AuthTest, ARefusalAsksForABearerToken) {
  auto r = AuthRefusal(Error(ENOKEY, "launcher: no token"));
  EXPECT_EQ(r.status, 401);
  bool asked = false;
  for (const auto& [k, v] : r.headers) asked |= k == "WWW-Authenticate" && v == "Bearer";
  EXPECT_TRUE(asked);
  EXPECT_EQ(AuthRefusal(Error(EPERM, "x")).status, 403);
}

}  // namespace
}  // namespace strata::launcher
