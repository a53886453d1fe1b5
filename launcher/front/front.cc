// The answer policy both fronts share.
#include "launcher/front/front.h"

#include <strings.h>

#include <algorithm>
#include <new>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "common/strings.h"

namespace strata::launcher {

using Request = HttpServer::Request;
using Response = HttpServer::Response;

Response Answer(const Request& req, const std::function<Result<Caller>(const Request&)>& authenticate,
                const std::function<Response(const Request&, const Caller&)>& route) {
  Response r;
  auto caller = authenticate(req);
  if (!caller.ok()) {
    r = AuthRefusal(caller.status());
  } else {
    try {
      r = route(req, *caller);
    } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
      r = HttpServer::ErrorResponse(Error(EINVAL, StrCat(req.method, " ", req.path, ": ", e.what())));
    } catch (const std::logic_error& e) {  // a number that is not one
      r = HttpServer::ErrorResponse(Error(EINVAL, StrCat(req.method, " ", req.path, ": bad value (", e.what(), ")")));
    } catch (const std::bad_alloc&) {
      r = HttpServer::ErrorResponse(Error(ENOMEM, StrCat(req.method, " ", req.path, ": out of memory")));
    } catch (const std::exception& e) {
      r = HttpServer::ErrorResponse(Error(EIO, StrCat(req.method, " ", req.path, ": ", e.what())));
    }
  }
  // The answers a client may retry, and only those, say when.
  if ((r.status == 429 || r.status == 503) &&
      std::none_of(r.headers.begin(), r.headers.end(), [](const auto& h) { return strcasecmp(h.first.c_str(), "retry-after") == 0; })) {
    r.headers.emplace_back("Retry-After", "1");
  }
  return r;
}

}  // namespace strata::launcher
