# syntax=docker/dockerfile:1
# haptic's container image: the static (musl) binary and the user it runs as, nothing else (no
# shell, no libc). `make image` assembles the same image without Docker (.ci/oci-image.py: the
# same files, owners and settings; tests/image.rs checks the two agree). docs/image.md says more.

FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools cmake \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin haptic
# The root filesystem besides the binary: the user (65532) in passwd and group, an empty /tmp,
# and the journal's directory, owned by that user (a PVC is mounted over it in the chart).
RUN mkdir -p /rootfs/etc /rootfs/tmp /rootfs/var/lib/haptic \
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nhaptic:x:65532:65532:haptic:/nonexistent:/sbin/nologin\n' > /rootfs/etc/passwd \
 && printf 'root:x:0:\nhaptic:x:65532:\n' > /rootfs/etc/group \
 && chmod 1777 /rootfs/tmp \
 && chmod 700 /rootfs/var/lib/haptic \
 && chown 65532:65532 /rootfs/var/lib/haptic

FROM scratch
COPY --from=build /rootfs/ /
COPY --from=build /src/target/x86_64-unknown-linux-musl/release/haptic /usr/local/bin/haptic
ENV PATH=/usr/local/bin
USER 65532:65532
WORKDIR /
EXPOSE 8080/tcp 8081/tcp
ENTRYPOINT ["/usr/local/bin/haptic"]
CMD ["run"]
