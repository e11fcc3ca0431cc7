// Keys and certificates for the HTTPS tests, made at test time with the openssl tool
// (P-256 keys: quick to make). Each certificate names localhost and 127.0.0.1.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "support/test_support.hpp"

namespace troupe::test {

struct TlsCertificates {
  // Skips the test, saying why, where the openssl tool is absent; fails it where the tool
  // cannot make the files.
  explicit TlsCertificates(const std::string& name) : dir(temp_path(name)) {
    if (std::system("openssl version >/dev/null 2>&1") != 0) {
      skip_test("the openssl tool is absent (scripts/setup.sh installs it)");
    }
    made = run("mkdir -p " + dir) &&
           // A self-signed server certificate: what a client's --cacert names.
           self_signed("self") &&
           // A CA; the server's and a client's certificates signed by it; a stranger's own.
           self_signed("ca") && signed_by_ca("server") && signed_by_ca("client") &&
           self_signed("stranger");
  }

  ~TlsCertificates() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  TlsCertificates(const TlsCertificates&) = delete;
  TlsCertificates& operator=(const TlsCertificates&) = delete;

  std::string key(const std::string& who) const { return dir + "/" + who + ".key"; }
  std::string cert(const std::string& who) const { return dir + "/" + who + ".pem"; }

  std::string dir;
  bool made = false;

 private:
  static bool run(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
  }
  static std::string new_key() {
    return " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost"
           " -addext subjectAltName=IP:127.0.0.1,DNS:localhost";
  }
  bool self_signed(const std::string& who) const {
    return run("openssl req -x509 -days 2" + new_key() + " -keyout " + key(who) + " -out " +
               cert(who));
  }
  bool signed_by_ca(const std::string& who) const {
    const std::string csr = dir + "/" + who + ".csr";
    return run("openssl req -new" + new_key() + " -keyout " + key(who) + " -out " + csr) &&
           run("openssl x509 -req -days 2 -copy_extensions copy -in " + csr + " -CA " + cert("ca") +
               " -CAkey " + key("ca") + " -CAcreateserial -out " + cert(who));
  }
};

}  // namespace troupe::test
