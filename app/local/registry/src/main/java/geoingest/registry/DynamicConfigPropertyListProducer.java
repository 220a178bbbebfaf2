package geoingest.registry;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import java.util.List;
import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.inject.Produces;

/**
 * The list of Apicurio's runtime-editable ("dynamic") configuration properties.
 *
 * <p>Apicurio's build makes this bean with a Quarkus extension whose build-time half
 * (io.apicurio:apicurio-common-app-components-config-index-deployment) is not on Maven Central.
 * Without it the list is empty: no property can be changed at run time through the admin API,
 * which the local registry of the tests never does; the rest of the registry is unchanged.
 */
@ApplicationScoped
public class DynamicConfigPropertyListProducer {
  @Produces
  @ApplicationScoped
  DynamicConfigPropertyList dynamicConfigProperties() {
    return new DynamicConfigPropertyList(List.of());
  }
}
