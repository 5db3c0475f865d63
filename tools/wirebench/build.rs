//! Generates the gRPC client and server of the benchmark service from a description in
//! Rust (tonic-build's manual builder), so no `protoc` is needed. The messages are written
//! by hand with prost's derive in `src/grpc.rs`.

fn main() {
    let method = |name: &str, input: &str, output: &str| {
        // The route is the name in CamelCase: `pull_row_list` is `PullRowList`.
        let route: String = name
            .split('_')
            .flat_map(|w| {
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase())
                    .into_iter()
                    .chain(c)
            })
            .collect();
        tonic_build::manual::Method::builder()
            .name(name)
            .route_name(route)
            .input_type(format!("crate::grpc::{input}"))
            .output_type(format!("crate::grpc::{output}"))
            .codec_path("tonic::codec::ProstCodec")
            .build()
    };
    // (method, request, reply)
    let methods = [
        ("ping", "PingMessage", "PingMessage"),
        ("pull", "PullRequest", "PullReply"),
        ("push", "PushRequest", "PushReply"),
        // The rows workloads: one `bytes` per row (kind `grpc`) ...
        ("pull_row_list", "RowsRequest", "RowList"),
        ("push_row_list", "PushRowList", "RowsPushed"),
        // ... and the ids packed, the rows in one `bytes` block (kind `grpc-packed`).
        ("pull_row_block", "RowsRequest", "RowBlock"),
        ("push_row_block", "PushRowBlock", "RowsPushed"),
    ];
    let service = methods
        .into_iter()
        .fold(
            tonic_build::manual::Service::builder()
                .name("Bench")
                .package("wirebench"),
            |service, (name, input, output)| service.method(method(name, input, output)),
        )
        .build();
    tonic_build::manual::Builder::new().compile(&[service]);
    println!("cargo:rerun-if-changed=build.rs");
}
