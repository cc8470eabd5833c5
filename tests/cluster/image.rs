//! The container image (#16): `make image` assembles it without Docker (.ci/oci-image.py);
//! this test reads it as an OCI tool would (Debian's umoci unpacks it), runs its binary from
//! the image's own root filesystem (read-only, as the image's user), and checks that it is
//! static and non-root, reproducible, the image the chart names, and what the Dockerfile builds.
//! `make test` builds the image first; alone: `make image && cargo test --test image`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use haptic::files::Checksum;
use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn image_dir() -> PathBuf {
    std::env::var_os("HAPTIC_IMAGE_DIR").map(PathBuf::from).unwrap_or_else(|| repo().join("target/image"))
}

fn run(command: &mut Command) -> Result<String> {
    let output = command.output().with_context(|| format!("running {command:?}"))?;
    ensure!(
        output.status.success(),
        "{command:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A blob of the layout, checked against its digest.
fn blob(layout: &Path, digest: &str) -> Result<Vec<u8>> {
    let hex = digest.strip_prefix("sha256:").context("a sha256 digest")?;
    let data = std::fs::read(layout.join("blobs/sha256").join(hex)).with_context(|| format!("blob {digest}"))?;
    ensure!(Checksum::of(&data).to_string() == hex, "blob {digest} does not match its digest");
    Ok(data)
}

/// Whether an ELF executable asks for a program interpreter (a dynamic loader): static ones don't.
fn has_interpreter(elf: &[u8]) -> Result<bool> {
    ensure!(elf.len() > 64 && &elf[..4] == b"\x7fELF" && elf[4] == 2, "not a 64-bit ELF file");
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    let offset = u64::from_le_bytes(elf[0x20..0x28].try_into()?) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    for i in 0..count {
        let at = offset + i * size;
        let kind = u32::from_le_bytes(elf.get(at..at + 4).context("program header past the end")?.try_into()?);
        if kind == 3 {
            return Ok(true); // PT_INTERP
        }
    }
    Ok(false)
}

/// The first `printf '...' > PATH` argument in the Dockerfile writing `path`, unescaped.
fn dockerfile_printf(dockerfile: &str, path: &str) -> Option<String> {
    let line = dockerfile.lines().find(|line| line.contains("printf '") && line.contains(&format!("> {path}")))?;
    let start = line.find("printf '")? + "printf '".len();
    let end = start + line[start..].find('\'')?;
    Some(line[start..end].replace("\\n", "\n"))
}

#[test]
fn the_image_runs_its_static_binary_as_a_non_root_user_from_a_read_only_root_and_is_the_charts() -> Result<()> {
    let layout = image_dir().join("oci");
    if !layout.join("index.json").is_file() {
        bail!("no image at {}: run `make image` first (`make test` does)", layout.display());
    }
    // The layout, as the OCI image spec has it: index → manifest → config and layer.
    let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)?;
    let entry = index["manifests"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == VERSION))
        .with_context(|| format!("no manifest tagged {VERSION} in {index}"))?;
    let manifest: Value = serde_json::from_slice(&blob(&layout, entry["digest"].as_str().unwrap_or_default())?)?;
    let config: Value =
        serde_json::from_slice(&blob(&layout, manifest["config"]["digest"].as_str().unwrap_or_default())?)?;
    for layer in manifest["layers"].as_array().context("layers")? {
        blob(&layout, layer["digest"].as_str().unwrap_or_default())?;
    }
    let settings = &config["config"];
    ensure!(settings["User"] == "65532:65532", "the image runs as {}", settings["User"]);
    ensure!(settings["Entrypoint"] == serde_json::json!(["/usr/local/bin/haptic"]), "{settings}");

    // The chart's default image is this one.
    let values: Value = serde_saphyr::from_str(&std::fs::read_to_string(repo().join("chart/values.yaml"))?)?;
    let chart: Value = serde_saphyr::from_str(&std::fs::read_to_string(repo().join("chart/Chart.yaml"))?)?;
    let tag = match values["controller"]["image"]["tag"].as_str() {
        Some(tag) if !tag.is_empty() => tag.to_owned(),
        _ => chart["appVersion"].as_str().context("appVersion")?.to_owned(),
    };
    let charts_image = format!("{}:{tag}", values["controller"]["image"]["repository"].as_str().unwrap_or_default());
    ensure!(
        entry["annotations"]["io.containerd.image.name"] == charts_image.as_str() && tag == VERSION,
        "the chart deploys {charts_image}, the image is {}",
        entry["annotations"]["io.containerd.image.name"]
    );

    // Unpacked by an OCI tool that is not ours.
    let work = tempfile::tempdir()?;
    let bundle = work.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:{VERSION}", layout.display()))
        .arg(&bundle))?;
    let runtime: Value = serde_json::from_slice(&std::fs::read(bundle.join("config.json"))?)?;
    ensure!(
        runtime["process"]["user"]["uid"] == 65532 && runtime["process"]["user"]["gid"] == 65532,
        "umoci runs it as {}",
        runtime["process"]["user"]
    );
    let rootfs = bundle.join("rootfs");
    let binary = std::fs::read(rootfs.join("usr/local/bin/haptic"))?;
    ensure!(!has_interpreter(&binary)?, "the binary asks for a dynamic loader: it is not static");
    // The check tells the two apart: the test build of the same binary is dynamic (glibc).
    ensure!(has_interpreter(&std::fs::read(env!("CARGO_BIN_EXE_haptic"))?)?, "the ELF check sees no loader anywhere");
    let mut files: Vec<String> = Vec::new();
    for entry in walk(&rootfs)? {
        files.push(entry.strip_prefix(&rootfs)?.display().to_string());
    }
    files.sort();
    ensure!(
        files
            == [
                "etc",
                "etc/group",
                "etc/passwd",
                "tmp",
                "usr",
                "usr/local",
                "usr/local/bin",
                "usr/local/bin/haptic",
                "var",
                "var/lib",
                "var/lib/haptic"
            ],
        "the image holds more or less than it should: {files:?}"
    );

    // Its binary runs from the image's root alone (no library of this machine's), read-only,
    // as the image's user.
    let root = rootfs.display().to_string();
    let script = format!(
        "mount --bind '{root}' '{root}' && mount -o remount,bind,ro '{root}' && \
         chroot --userspec=65532:65532 '{root}' /usr/local/bin/haptic --version && \
         chroot --userspec=65532:65532 '{root}' /usr/local/bin/haptic state-diagram >/dev/null && \
         ! touch '{root}/tmp/written' 2>/dev/null"
    );
    let version = run(Command::new("unshare").args(["--mount", "--propagation", "private", "sh", "-c", &script]))?;
    ensure!(version.trim() == format!("haptic {VERSION}"), "haptic --version said {version:?}");

    // The Dockerfile builds the same image: its user, entry point and root filesystem files.
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile"))?;
    for line in
        ["USER 65532:65532", "ENTRYPOINT [\"/usr/local/bin/haptic\"]", "CMD [\"run\"]", "EXPOSE 8080/tcp 8081/tcp"]
    {
        ensure!(dockerfile.lines().any(|l| l.trim() == line), "the Dockerfile lacks `{line}`");
    }
    ensure!(settings["Cmd"] == serde_json::json!(["run"]), "{settings}");
    let exposed: Vec<&String> = settings["ExposedPorts"].as_object().context("ExposedPorts")?.keys().collect();
    ensure!(exposed == ["8080/tcp", "8081/tcp"], "{exposed:?}");
    for file in ["/rootfs/etc/passwd", "/rootfs/etc/group"] {
        let built = dockerfile_printf(&dockerfile, file).with_context(|| format!("the Dockerfile writes no {file}"))?;
        let ours = std::fs::read_to_string(rootfs.join(file.trim_start_matches("/rootfs/")))?;
        ensure!(built == ours, "{file}: the Dockerfile writes {built:?}, the image holds {ours:?}");
    }

    // Reproducible: the same binary gives the same image.
    let again = work.path().join("again");
    run(Command::new("python3")
        .arg(repo().join(".ci/oci-image.py"))
        .arg("--binary")
        .arg(rootfs.join("usr/local/bin/haptic"))
        .arg("--out")
        .arg(&again)
        .args(["--repository", charts_image.rsplit_once(':').map_or("", |(r, _)| r)]))?;
    let index_again: Value = serde_json::from_slice(&std::fs::read(again.join("oci/index.json"))?)?;
    ensure!(index_again == index, "a second assembly differs:\n{index}\n{index_again}");
    Ok(())
}

fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        found.push(path.clone());
        if path.is_dir() && !path.is_symlink() {
            found.extend(walk(&path)?);
        }
    }
    Ok(found)
}
