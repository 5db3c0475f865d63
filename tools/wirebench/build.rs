//! Generates the gRPC client and server of the benchmark service from a description in
//! Rust (tonic-build's manual builder), so no `protoc` is needed. The messages are written
//! by hand with prost's derive in `src/grpc.rs`.

fn main() {
    let method = |name: &str, route: &str, input: &str, output: &str| {
        tonic_build::manual::Method::builder()
            .name(name)
            .route_name(route)
            .input_type(format!("crate::grpc::{input}"))
            .output_type(format!("crate::grpc::{output}"))
            .codec_path("tonic::codec::ProstCodec")
            .build()
    };
    let service = tonic_build::manual::Service::builder()
        .name("Bench")
        .package("wirebench")
        .method(method("ping", "Ping", "PingMessage", "PingMessage"))
        .method(method("pull", "Pull", "PullRequest", "PullReply"))
        .method(method("push", "Push", "PushRequest", "PushReply"))
        .build();
    tonic_build::manual::Builder::new().compile(&[service]);
    println!("cargo:rerun-if-changed=build.rs");
}
