"""boto3, as S3 users run it, for tests/s3.rs.

    python3 tests/s3_clients.py ENDPOINT COMMAND BUCKET KEY [FILE | SECONDS]

ENDPOINT is the S3 server itself (to upload) or rangeway (to download). Credentials come from the
environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY). Prints one JSON object.
"""

import json
import sys

import boto3
import botocore.config
from boto3.s3.transfer import TransferConfig

MiB = 1024 * 1024


def client(endpoint):
    config = botocore.config.Config(
        # Presigned URLs too are SigV4 (boto3 would make SigV2 ones for a custom endpoint).
        signature_version="s3v4",
        s3={"addressing_style": "path"},
        retries={"max_attempts": 1, "mode": "standard"},
        connect_timeout=5,
        read_timeout=20,
    )
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=config)


def main():
    endpoint, command, bucket, key = sys.argv[1:5]
    path = sys.argv[5] if len(sys.argv) > 5 else None
    s3 = client(endpoint)
    if command == "upload-multipart":
        # 5 MiB parts, S3's smallest: an object of 11 MiB gets an ETag "…-3".
        config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
        s3.upload_file(path, bucket, key, Config=config)
        head = s3.head_object(Bucket=bucket, Key=key)
        print(json.dumps({"etag": head["ETag"]}))
    elif command == "put-checksum":
        with open(path, "rb") as f:
            put = s3.put_object(Bucket=bucket, Key=key, Body=f.read(), ChecksumAlgorithm="CRC32")
        print(json.dumps({"crc32": put.get("ChecksumCRC32"), "etag": put["ETag"]}))
    elif command == "download":
        # Ranged parts of 1 MiB on 4 threads: HeadObject, then GetObject with Range (and If-Match
        # in recent s3transfer), checksums validated where S3 sends them.
        config = TransferConfig(
            multipart_threshold=MiB, multipart_chunksize=MiB, max_concurrency=4
        )
        s3.download_file(bucket, key, path, Config=config)
        print(json.dumps({"ok": True}))
    elif command == "head":
        head = s3.head_object(Bucket=bucket, Key=key)
        print(json.dumps({"length": head["ContentLength"], "etag": head["ETag"]}))
    elif command == "presign":
        # FILE is the URL's lifetime in seconds here.
        url = s3.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=int(path)
        )
        print(json.dumps({"url": url}))
    elif command == "get-error":
        try:
            s3.get_object(Bucket=bucket, Key=key)
            print(json.dumps({"error": None}))
        except s3.exceptions.NoSuchKey:
            print(json.dumps({"error": "NoSuchKey", "modeled": True}))
        except botocore.exceptions.ClientError as e:
            print(json.dumps({"error": e.response["Error"]["Code"], "modeled": False}))
    else:
        sys.exit(f"unknown command {command}")


main()
