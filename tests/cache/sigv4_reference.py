#!/usr/bin/python3
"""Signs requests with botocore's S3SigV4Auth: the independent SigV4
implementation s3_signature_test.cc holds our signatures against.

stdin: {"access_key", "secret_key", "token" (or null), "region",
        "requests": [{"method", "target", "headers": {lowercase name: value}}]}
stdout: one Authorization value per request, in order, one per line.

Each request is signed over the headers our Authorization names in
SignedHeaders (as a server would), at the time of its x-amz-date; the query
is decoded and handed to botocore as parameters, so botocore encodes and
sorts it by its own rules.
"""
import json
import sys
from urllib.parse import parse_qsl

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def main():
    cfg = json.load(sys.stdin)
    creds = Credentials(cfg["access_key"], cfg["secret_key"], cfg.get("token"))
    for r in cfg["requests"]:
        headers = r["headers"]
        ours = headers["authorization"]
        signed = ours.split("SignedHeaders=")[1].split(",")[0].split(";")
        path, _, query = r["target"].partition("?")
        params = parse_qsl(query, keep_blank_values=True, strict_parsing=False)
        request = AWSRequest(
            method=r["method"],
            url="http://" + headers["host"] + path,
            headers={name: headers[name] for name in signed if name in headers},
            params=params,
        )
        request.context["timestamp"] = headers["x-amz-date"]
        auth = S3SigV4Auth(creds, "s3", cfg["region"])
        canonical = auth.canonical_request(request)
        signature = auth.signature(auth.string_to_sign(request, canonical), request)
        signed_names = auth.signed_headers(auth.headers_to_sign(request))
        print("AWS4-HMAC-SHA256 Credential=%s, SignedHeaders=%s, Signature=%s"
              % (auth.scope(request), signed_names, signature))


if __name__ == "__main__":
    main()
