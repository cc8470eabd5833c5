//! Process-wide TLS setup.

/// Installs aws-lc-rs as the process default rustls provider.
///
/// kube and reqwest both build rustls clients; if two providers are compiled in and none is
/// the default, the first client panics. Call this once, first thing in `main`.
pub fn install_crypto_provider() {
    // An error only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
