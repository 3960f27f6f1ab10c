//! src/http/assets.rs embeds the browser bundle (`make app`) with include_dir, whose macro
//! tracks no files on stable: a changed bundle must rerun this script so the crate is
//! rebuilt with it. The folder always exists (its .gitignore is committed).

fn main() {
    println!("cargo:rerun-if-changed=../../clients/web/dist-app");
}
