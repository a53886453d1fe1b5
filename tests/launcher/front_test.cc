// The API front both the node and the gateway answer through: a refused
// caller, what a route throws, and the retry hint, mapped alike.
#include "launcher/front/front.h"

#include <gtest/gtest.h>

#include <strings.h>

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace strata::launcher {
namespace {

using Request = HttpServer::Request;
using Response = HttpServer::Response;

Request Get(const std::string& path) {
  Request r;
  r.method = "GET";
  r.path = path;
  return r;
}

std::string Header(const Response& r, const std::string& name) {
  std::string found;
  int count = 0;
  for (const auto& [k, v] : r.headers) {
    if (strcasecmp(k.c_str(), name.c_str()) == 0) {
      found = v;
      ++count;
    }
  }
  EXPECT_LE(count, 1) << name << " given twice";
  return found;
}

nlohmann::json Body(const Response& r) { return nlohmann::json::parse(r.body); }

auto Operator() {
  return [](const Request&) -> Result<Caller> { return Caller{.is_operator = true}; };
}

TEST(FrontTest, ARefusedCallerIsAnsweredByItsErrorAndNeverRouted) {
  bool routed = false;
  auto route = [&](const Request&, const Caller&) {
    routed = true;
    return Response{};
  };
  Response none = Answer(Get("/v1/sandboxes"), [](const Request&) -> Result<Caller> {
    return Error(ENOKEY, "launcher: no token");
  }, route);
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(Header(none, "www-authenticate"), "Bearer");
  EXPECT_EQ(Body(none)["errno"], ENOKEY);
  Response forbidden = Answer(Get("/v1/sandboxes"), [](const Request&) -> Result<Caller> {
    return Error(EPERM, "launcher: only a gateway's credential may name a tenant");
  }, route);
  EXPECT_EQ(forbidden.status, 403);
  EXPECT_NE(Body(forbidden)["error"].get<std::string>().find("only a gateway's credential"), std::string::npos);
  EXPECT_FALSE(routed);
}

TEST(FrontTest, TheRouteSeesTheCaller) {
  auto tenant = std::make_shared<Tenant>();
  tenant->name = "team-a";
  std::string seen;
  Response r = Answer(Get("/v1/sandboxes"), [&](const Request&) -> Result<Caller> { return Caller{.tenant = tenant}; },
                      [&](const Request&, const Caller& caller) {
                        seen = caller.scope();
                        Response ok;
                        ok.status = 200;
                        return ok;
                      });
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(seen, "team-a");
  EXPECT_EQ(Header(r, "www-authenticate"), "");
  EXPECT_EQ(Caller{.is_operator = true}.scope(), "");
}

TEST(FrontTest, WhatARouteThrowsIsAnErrorNamingTheRequest) {
  // A field of the wrong type: 400.
  Response wrong_type = Answer(Get("/v1/x"), Operator(), [](const Request&, const Caller&) -> Response {
    nlohmann::json j = {{"cpus", "two"}};
    (void)j["cpus"].get<double>();
    return {};
  });
  EXPECT_EQ(wrong_type.status, 400);
  EXPECT_NE(Body(wrong_type)["error"].get<std::string>().find("GET /v1/x: "), std::string::npos) << wrong_type.body;
  // A number that is not one: 400, a bad value.
  Response not_a_number = Answer(Get("/v1/y"), Operator(), [](const Request&, const Caller&) -> Response {
    (void)std::stoi("many");
    return {};
  });
  EXPECT_EQ(not_a_number.status, 400);
  EXPECT_NE(Body(not_a_number)["error"].get<std::string>().find("GET /v1/y: bad value"), std::string::npos) << not_a_number.body;
  // Anything else is the server's failure, not the caller's: 500.
  Response broken = Answer(Get("/v1/z"), Operator(), [](const Request&, const Caller&) -> Response {
    throw std::runtime_error("disk on fire");
  });
  EXPECT_EQ(broken.status, 500);
  EXPECT_NE(Body(broken)["error"].get<std::string>().find("GET /v1/z: disk on fire"), std::string::npos) << broken.body;
  Response no_memory = Answer(Get("/v1/w"), Operator(), [](const Request&, const Caller&) -> Response {
    throw std::bad_alloc();
  });
  EXPECT_EQ(no_memory.status, 500);
  EXPECT_EQ(Body(no_memory)["errno"], ENOMEM);
}

TEST(FrontTest, OnlyAnswersWorthRetryingSayWhenAndOnce) {
  auto answering = [](int status, bool own_hint) {
    return [status, own_hint](const Request&, const Caller&) {
      Response r;
      r.status = status;
      if (own_hint) r.headers.emplace_back("Retry-After", "7");
      return r;
    };
  };
  EXPECT_EQ(Header(Answer(Get("/"), Operator(), answering(429, false)), "retry-after"), "1");
  EXPECT_EQ(Header(Answer(Get("/"), Operator(), answering(503, false)), "retry-after"), "1");
  // A node's own hint, passed on by a gateway, is kept and not doubled.
  EXPECT_EQ(Header(Answer(Get("/"), Operator(), answering(503, true)), "retry-after"), "7");
  // Retrying a conflict does not help: no hint.
  EXPECT_EQ(Header(Answer(Get("/"), Operator(), answering(409, false)), "retry-after"), "");
  EXPECT_EQ(Header(Answer(Get("/"), Operator(), answering(200, false)), "retry-after"), "");
  // An overloaded node's refusal of admission (EAGAIN) says so too.
  Response full = Answer(Get("/"), Operator(), [](const Request&, const Caller&) {
    return HttpServer::ErrorResponse(Error(EAGAIN, "node full"));
  });
  EXPECT_EQ(full.status, 503);
  EXPECT_EQ(Header(full, "retry-after"), "1");
}

}  // namespace
}  // namespace strata::launcher
