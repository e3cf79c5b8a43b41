//! Real download clients resume interrupted downloads through rangeway, in front of nginx and in
//! front of an origin that ignores Range (rangeway slices for it); every file ends byte-identical.

mod support;

use support::clients::{
    aria2c_download, curl_resume, sha256_file, sha256_hex, wget_resume, write_partial,
};
use support::data::test_bytes;
use support::nginx::{Nginx, NginxOptions};
use support::origin::{Behaviour, Origin};
use support::proxy::Proxy;
use support::tmp::TempDir;

const LEN: usize = 5 * 1024 * 1024 + 12_345;

fn resume_with_every_client(proxy: &Proxy, object: &[u8], work: &TempDir) {
    let url = proxy.url("/big.bin");
    let want = sha256_hex(object);
    for (offset, name) in [(1, "curl-1"), (LEN / 3, "curl-third"), (LEN - 1, "curl-last")] {
        let file = work.join(name);
        write_partial(&file, object, offset);
        curl_resume(&url, &file).assert_success();
        assert_eq!(sha256_file(&file), want, "curl resumed at {offset}");
    }
    let file = work.join("wget");
    write_partial(&file, object, LEN / 2);
    wget_resume(&url, &file).assert_success();
    assert_eq!(sha256_file(&file), want, "wget");

    aria2c_download(&url, work.path(), "aria2").assert_success();
    assert_eq!(sha256_file(&work.join("aria2")), want, "aria2c -x8");
}

#[test]
fn clients_resume_through_rangeway_in_front_of_nginx() {
    let root = TempDir::new("clients-root");
    let object = test_bytes(LEN, 3);
    std::fs::write(root.join("big.bin"), &object).unwrap();
    let nginx = Nginx::start(NginxOptions::serving(root.path()));
    let proxy = Proxy::in_front_of(&nginx.base_url());
    resume_with_every_client(&proxy, &object, &TempDir::new("clients-work"));
}

#[test]
fn clients_resume_even_when_the_origin_ignores_range() {
    let origin = Origin::start();
    let object = test_bytes(LEN, 4);
    origin.put("/big.bin", object.clone());
    origin.set_global_behaviour(Behaviour::IgnoreRange);
    let proxy = Proxy::in_front_of(&origin.base_url());
    resume_with_every_client(&proxy, &object, &TempDir::new("clients-ignore"));
}
